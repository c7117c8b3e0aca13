"""A command asked to end by SIGTERM or Ctrl-C ends, wherever its main thread was
(`harness.cli.signals.end_like_ctrl_c_on_sigterm`): Python drops the exception a signal's handler
raises in a destructor, a weakref callback or a fork hook, and without
`raise_signals_again_where_dropped` the command went on (exit status 0). Each case runs in a
fresh interpreter, as a command does, and lands its signal in such a place on purpose."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import REPO_ROOT

_SIGNAL_WHERE_DROPPED = """
import gc, os, signal, subprocess, sys, time, weakref
from harness.cli.signals import end_like_ctrl_c_on_sigterm

# Ctrl-C as a command in the foreground meets it: a shell starts its background jobs with
# SIGINT ignored, and Python then leaves it ignored (a suite run with `nohup ... &`)
signal.signal(signal.SIGINT, signal.default_int_handler)
end_like_ctrl_c_on_sigterm()

def signal_here():
    os.kill(os.getpid(), SIGNUM)
    time.sleep(0.2)  # its handler runs here: in the fork hook, destructor or callback

class Finalized:
    def __del__(self):
        signal_here()

if WHERE == "fork hook":
    os.register_at_fork(after_in_parent=signal_here)
    subprocess.run(["true"], preexec_fn=lambda: None)  # a preexec_fn runs the fork hooks
elif WHERE == "destructor":
    Finalized()
elif WHERE == "weakref callback":
    class Referent:
        pass
    referent = Referent()
    reference = weakref.ref(referent, lambda _: signal_here())
    del referent
elif WHERE == "garbage collection":
    cycle = Finalized()
    cycle.itself = cycle
    del cycle
    gc.collect()
time.sleep(30)  # a blocking call (a launcher waiting for a cell): the signal ends it at once
print("went on", flush=True)
"""


def _signalled_where_dropped(where: str, signum: int) -> subprocess.CompletedProcess[str]:
    """The script run in a fresh interpreter; it times out (the test fails) where the signal
    raised again waits for the script's 30 s sleep to end instead of ending it."""
    script = f"WHERE = {where!r}\nSIGNUM = {int(signum)}\n" + textwrap.dedent(_SIGNAL_WHERE_DROPPED)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=20, cwd=REPO_ROOT
    )


@pytest.mark.parametrize(
    "where", ["fork hook", "destructor", "weakref callback", "garbage collection"]
)
def test_sigterm_handled_where_python_drops_its_exception_still_ends_the_command(
    where: str,
) -> None:
    ended = _signalled_where_dropped(where, signal.SIGTERM)
    assert ended.returncode == 128 + signal.SIGTERM, ended.stderr[-2000:]
    assert "went on" not in ended.stdout


def test_ctrl_c_handled_in_a_destructor_still_ends_the_command() -> None:
    ended = _signalled_where_dropped("destructor", signal.SIGINT)
    # KeyboardInterrupt unhandled: Python ends itself with SIGINT, as the shell expects
    assert ended.returncode == -signal.SIGINT, ended.stderr[-2000:]
    assert "KeyboardInterrupt" in ended.stderr and "went on" not in ended.stdout


def test_other_exceptions_python_drops_are_still_reported_as_before() -> None:
    script = textwrap.dedent("""
        from harness.cli.signals import end_like_ctrl_c_on_sigterm
        end_like_ctrl_c_on_sigterm()
        end_like_ctrl_c_on_sigterm()  # idempotent: one hook
        class Broken:
            def __del__(self):
                raise ValueError("broken in its destructor")
        Broken()
        print("went on", flush=True)
    """)
    ended = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT
    )
    assert ended.returncode == 0 and ended.stdout == "went on\n"
    assert ended.stderr.count("Exception ignored in") == 1
    assert "ValueError: broken in its destructor" in ended.stderr
