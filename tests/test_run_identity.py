"""A run folder's identity (``run.json``): kept across relaunches, and a damaged file set aside, never lost."""

import json
import re

import pytest

from ember._run_identity import remember_tracker_run, run_identity, tracker_run


def test_the_identity_is_made_once_and_read_back_with_the_tracker_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = run_identity("runs/a")  # a relative path, the folder made
    assert re.fullmatch(r"[0-9a-f]{16}", first["id"])
    remember_tracker_run("runs/a", "mlflow", "4f2a")
    remember_tracker_run(tmp_path / "runs" / "a", "wandb", first["id"])  # the same folder, absolute
    assert run_identity("runs/a") == {
        "id": first["id"],
        "path": str(tmp_path.resolve() / "runs" / "a"),  # where it was made, absolute
        "trackers": {"mlflow": "4f2a", "wandb": first["id"]},
    }
    assert (tracker_run("runs/a", "mlflow"), tracker_run("runs/a", "other")) == ("4f2a", None)
    assert run_identity("runs/b")["id"] != first["id"]
    assert sorted(p.name for p in (tmp_path / "runs" / "a").iterdir()) == ["run.json"]  # no temporary left


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"id": "0123456789ab', "it cannot be read"),  # truncated
        ("\x00\x00\x00", "it cannot be read"),  # overwritten
        ('{"id": 5, "trackers": {}}', "it does not hold a run id"),  # altered
        ('{"id": "ab", "trackers": [1]}', "it does not hold a run id"),
        ("[]", "it does not hold a run id"),
        ('{"id": "../x", "trackers": {}}', "it does not hold a run id"),  # would name a folder outside the fast tier
        ('{"id": "' + "a" * 200 + '", "trackers": {}}', "it does not hold a run id"),  # past a folder name's length
        ('{"id": "", "trackers": {}}', "it does not hold a run id"),
    ],
)
def test_a_damaged_identity_is_moved_aside_with_a_warning_and_replaced(tmp_path, text, why):
    (tmp_path / "run.json").write_text(text)
    with pytest.warns(RuntimeWarning, match=re.escape(f"{tmp_path / 'run.json'}: {why}")) as caught:
        identity = run_identity(tmp_path)
    (aside,) = tmp_path.glob("run.json.damaged-*")
    assert aside.read_text() == text  # kept for a person to read
    assert f"moved to {aside.name}. The run gets a new identity" in str(caught[0].message)
    assert json.loads((tmp_path / "run.json").read_text()) == identity
    assert run_identity(tmp_path) == identity  # and read back without a warning


def test_a_deleted_identity_is_made_anew(tmp_path):
    first = run_identity(tmp_path)
    (tmp_path / "run.json").unlink()
    assert run_identity(tmp_path)["id"] != first["id"]
