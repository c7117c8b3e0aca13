"""What a cell trains on, independent of how it is distributed: `datasets` (Table 3.2's datasets,
synthetic or real, and token data), `networks` (the thesis' networks, a user's module, model zoos
and language models, with their layer lists), `task` (the loss and accuracy of images and tokens
alike), `progress` (a progress bar on a terminal, plain lines in a file) and `plugins` (the
entry points through which other packages add network sources and distribution models).

The lowest layer of the code: it imports nothing of `harness`, `launchers` or `hydra_plugins`,
and its packages name their modules' exports without importing them (`lazy`), so that checking
a config loads no torch.
"""
