"""The step and its wrappers: `make_train_step`, the guard, the loss scale, precision, remat, extras, EMA."""
