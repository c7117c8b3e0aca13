"""Hydra launcher plugin of distbench (Hydra finds plugins in the `hydra_plugins` namespace).

The implementation lives in `launchers.serial_local`; this module only registers its config.
"""
