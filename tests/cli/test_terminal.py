"""``ember train`` in a real terminal (a pseudo-terminal): one clean bar per epoch, every line on its own."""

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time

from tests.subprocesses import PYTHONPATH, ROOT

BAR = re.compile(r"Epoch \[(\d)/2\]: \[(\d+)/22\] +(\d+)%\|")  # Ignite's bar: "Epoch [1/2]: [22/22] 100%|"


def in_a_terminal(args, timeout=240.0, interrupt_at=None):
    """Run ``python -m ember.cli *args`` with a 100-column pseudo-terminal as its stdout and stderr; all it drew.

    ``interrupt_at``: once the terminal shows this text, Ctrl-C (SIGINT) is sent, as a terminal sends it.
    """
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ember.cli", *args], cwd=ROOT, env=env, stdin=slave, stdout=slave, stderr=slave
    )
    os.close(slave)
    drawn, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed the terminal: all is read
                break
            if not chunk:
                break
            drawn += chunk
            if interrupt_at is not None and interrupt_at.encode() in drawn:
                proc.send_signal(signal.SIGINT)
                interrupt_at = None
    finally:
        proc.kill() if proc.poll() is None else None
        proc.wait(timeout=30)
        os.close(master)
    return proc.returncode, drawn.decode()


def test_each_epoch_ends_with_its_bar_full_and_its_line_below_it(tmp_path):
    """The bar reaches 22/22 and stays; the epoch's line starts a line of its own (it was glued onto a bar at 45%)."""
    status, drawn = in_a_terminal(["train", "--output", str(tmp_path / "run"), "trainer.max_epochs=2"])
    assert status == 0, drawn[-3000:]
    lines = drawn.split("\r\n")  # the terminal's line ends; "\r" alone redraws a bar in place
    epoch_lines = [i for i, line in enumerate(lines) if re.fullmatch(r"epoch +\d+ +iteration +\d+ +val .*", line)]
    assert len(epoch_lines) == 2, drawn
    for epoch, i in enumerate(epoch_lines, 1):
        frames = [m.groups() for m in BAR.finditer(lines[i - 1])]  # the bar's frames, drawn in place
        assert frames, drawn
        assert frames[-1] == (str(epoch), "22", "100")  # the bar's last frame: full
    assert lines[0].startswith("Training on cpu: ")
    assert lines[-2].startswith("Done: 2 epochs, 44 iterations")


def test_the_console_writer_prints_above_the_bars_and_no_epoch_line_twice(tmp_path):
    """handlers.writers=[console]: its lines stand on their own lines; the epoch line is not printed beside them."""
    status, drawn = in_a_terminal(
        ["train", "--output", str(tmp_path / "run"), "trainer.max_epochs=2", "handlers.writers=[console]"]
    )
    assert status == 0, drawn[-3000:]
    lines = drawn.split("\r\n")
    val = [line for line in lines if "val/accuracy" in line]
    assert [re.sub(r"\d\.\d{4}", "x", line) for line in val] == [  # whole lines: nothing drawn before them
        "step 22 | val/accuracy x | val/loss x",
        "step 44 | x s/step | val/accuracy x | val/loss x",
    ], drawn
    assert not any(re.match(r"epoch +\d+ +iteration", line.rsplit("\r", 1)[-1]) for line in lines), drawn


def test_a_batch_log_gets_one_line_an_epoch_and_no_bar_frames(tmp_path):
    """A batch log (stdout and stderr to a file: Slurm, CI, nohup), the default config: no bar frames, no escapes."""
    log = tmp_path / "slurm-123.out"
    with log.open("w") as out:
        done = subprocess.run(
            [sys.executable, "-m", "ember.cli", "train", "--output", str(tmp_path / "run"), "trainer.max_epochs=2"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": PYTHONPATH},
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=240,
            check=False,
        )
    text = log.read_text()
    assert done.returncode == 0, text[-3000:]
    assert "\r" not in text
    assert "\x1b" not in text
    lines = text.splitlines()
    assert lines[0].startswith("Training on cpu: 1 device")
    assert [line.split()[:4] for line in lines[1:3]] == [
        ["epoch", "1", "iteration", "22"],
        ["epoch", "2", "iteration", "44"],
    ]
    assert lines[3].startswith("Done: 2 epochs, 44 iterations in ")
    assert len(lines) == 4


def test_ctrl_c_prints_one_plain_line_on_its_own_below_the_bar(tmp_path):
    """Ctrl-C once the first epoch's line is out, in a long run: one line says where it stopped, nothing else.

    The line stands on its own, after the bar's or the epoch's; no logging line, no traceback.
    """
    status, drawn = in_a_terminal(
        ["train", "--output", str(tmp_path / "run"), "trainer.max_epochs=200"], interrupt_at="epoch   1  iteration"
    )
    assert status == 130, drawn[-3000:]
    lines = drawn.split("\r\n")
    assert lines[-1] == "", drawn
    assert re.fullmatch(
        r"Stopped at iteration \d+ \(Ctrl-C\), the checkpoint saved; run the same command to resume\. "
        r"Best val accuracy 0\.\d{4}\. Run folder: .*",
        lines[-2],
    ), drawn
    assert sum("Stopped" in line for line in lines) == 1, drawn
    assert "Signal" not in drawn, drawn
    assert "Traceback" not in drawn, drawn
    assert re.search(r"Epoch \[\d+/200\]: |^epoch +\d+ +iteration", lines[-3]), drawn  # a bar or an epoch's line
