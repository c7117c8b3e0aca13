"""The command line's plumbing: how every distbench command answers bad input: ONE line on stderr
that names the key and what is allowed, exit status 2, no traceback; before anything is trained,
submitted or written.

Bad input is a `ConfigError` (our validation: `harness.config.schema`, the launchers' sizing, a
command's own checks), or Hydra/OmegaConf rejecting an override (an unknown group option such as
`network=resnet19`, a misspelled key, a wrong type, a malformed override). Any other exception
(a store that cannot be used, a damaged state file, a library's error, a bug) leaves through
`one_door`: one line naming the setting involved, exit status 3, the traceback kept in a file
(DISTBENCH_DEBUG=1 prints it instead). A reader that closed the command's output (`... | head`)
ends it quietly with 141, as SIGPIPE ends a command.

Use it in an entry point in one of two ways:

1. A command that composes its config itself (`harness.commands.compose.compose_config`), e.g.
   `harness.describe`, `harness.plan`, `harness.analysis`, `harness.recommend`::

       from harness.cli.errors import command

       @command
       def main(argv: list[str] | None = None) -> None:
           config = validate(compose_config(sys.argv[1:] if argv is None else argv))
           if impossible(config):  # a check of the command's own
               raise ConfigError("key=value is invalid: <what is allowed>")
           ...

   or, around just the part that reads input, `with exit_on_bad_input(): ...`.

2. A `@hydra.main` program (`python -m harness`): Hydra composes before the decorated function
   runs and prints its own multi-line report, so call it through
   `launchers.hydra_main.run_hydra_main`::

       if __name__ == "__main__":
           run_hydra_main(main)

Raise `ConfigError` with the message form of `harness.config.schema`: "key=value is invalid:
allowed". A wrong flag of a command with flags is the same: build its parser with `ArgumentParser`
here.

Exit status 1 means the command ran cells and not every one ended `ok`: the launchers and
`python -m harness` note each cell's record (`note_cell_results`), `run_hydra_main` turns
them into the status, and the sweep's summary table says why each failed cell failed.

Modules: `bad_input` (exit status 2), `errors` (`one_door`, `command`: exit status 3),
`cell_results` (exit status 1), `signals` (SIGTERM ends a command as Ctrl-C does, never lost),
`arguments` (argparse that refuses a wrong flag in one line) and `preflight` (what a command
needs of this machine before it starts). Imports `harness.config` only.
"""
