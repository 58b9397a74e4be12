"""The ``abl run`` parent never hangs on plugin code, and stops cleanly on SIGTERM at any point.

Before any cell starts, the parent runs plugin code of its own: the memory check measures the forward of
a component that declares no cost function (abl.model.measuredcost), the grid's cost estimate and the
compile payback notes call the components' cost functions, the model is built on the meta device. A
plugin whose code never returns there would hang ``abl run`` before any cell starts (issue 39, finding
12). ``time_limit`` bounds each such step:

- at the limit, SIGALRM raises ``PluginTimeout`` in the main thread wherever the plugin's Python code
  is (a loop, a sleep, a lock), naming the step and the code it was stuck in; ``abl run`` exits 2;
- a plugin stuck in native code never gives the interpreter back, so no signal handler runs: a watchdog
  thread then ends the process itself ``NATIVE_GRACE_S`` later, with the same message, after the
  clean-ups registered with ``at_hard_exit`` (the store's lock file).

``Stopped`` is how SIGTERM (or SIGINT) reaches the parent: a KeyboardInterrupt naming the signal, so
every ``except KeyboardInterrupt`` path (stop the cells, store them, release the lock, exit 130) runs for
SIGTERM too, from the first line of ``abl run`` on (``stop_on_signals``).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
import types
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from ..contracts.status import signal_name

# after the limit, how long a step stuck in native code has to give the interpreter back before the
# watchdog ends the process (ABL_NATIVE_GRACE_S sets it)
NATIVE_GRACE_S = 30.0
# after SIGTERM or SIGINT, how long a step stuck in native code has before the watchdog ends the process (exit 130)
STOP_GRACE_S = 5.0
# the environment variable that sets the limit for every command (a plugin's import, its registration)
TIMEOUT_ENV = "ABL_PLUGIN_TIMEOUT"
# the environment variable that sets NATIVE_GRACE_S (a test's few seconds instead of 30)
GRACE_ENV = "ABL_NATIVE_GRACE_S"


def _env_problem(name: str, what: str) -> str:
    raw = os.environ.get(name, "").strip()
    try:
        ok = not raw or float(raw) >= 0
    except ValueError:
        ok = False
    return "" if ok else f"{name}={raw!r} is not a number of seconds >= 0 ({what})"


def env_timeout_problem() -> str:
    """Why ``ABL_PLUGIN_TIMEOUT`` or ``ABL_NATIVE_GRACE_S`` is not a number of seconds >= 0 (empty when both
    are, or are unset)."""
    return (_env_problem(TIMEOUT_ENV, "0: no limit")
            or _env_problem(GRACE_ENV, "how long plugin code stuck in native code has past its limit"))


def _env_seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    return float(raw) if raw and not _env_problem(name, "") else default


def _env_timeout(default: float) -> float:
    return _env_seconds(TIMEOUT_ENV, default)


def native_grace_s() -> float:
    """``NATIVE_GRACE_S``, or ``ABL_NATIVE_GRACE_S`` where it is set."""
    return _env_seconds(GRACE_ENV, NATIVE_GRACE_S)


# the parent's default limit for one step of plugin work before any cell starts (abl run --plugin-timeout), and
# for loading the plugins in every command; ABL_PLUGIN_TIMEOUT sets it
DEFAULT_PLUGIN_TIMEOUT_S = _env_timeout(600.0)


class Stopped(KeyboardInterrupt):
    """abl run was sent SIGTERM (handled as Ctrl-C): its name is the reason its cells were killed."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal_name(signum))
        self.signal_name = signal_name(signum)


def raise_stopped(signum, frame):
    raise Stopped(signum)


def stop_on_signals() -> None:
    """From here on SIGTERM raises ``Stopped`` in the main thread (SIGINT already raises
    KeyboardInterrupt): the process's clean-up runs instead of the default's silent death (exit 143,
    the store's lock file left behind)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, raise_stopped)


class PluginTimeout(BaseException):
    """Plugin code run by the parent did not return within its limit (a user error: exit status 2).

    A BaseException, so the plugin call sites that turn a plugin's ``Exception`` into a note or a
    fallback do not swallow it."""


_hard_exits: list[Callable[[], None]] = []


def at_hard_exit(fn: Callable[[], None]) -> Callable[[], None]:
    """Run ``fn`` before the watchdog ends a process stuck in native code; returns a function that
    takes it off the list again."""
    _hard_exits.append(fn)

    def remove() -> None:
        if fn in _hard_exits:
            _hard_exits.remove(fn)
    return remove


def _is_plugin_frame(frame: types.FrameType) -> bool:
    """Code that is neither abl's nor the standard library's nor an installed package's."""
    path = frame.f_code.co_filename
    if path.startswith("<"):
        return False
    abl_dir = str(Path(__file__).resolve().parent.parent)
    stdlib = os.path.dirname(os.__file__)
    return not (path.startswith(abl_dir) or path.startswith(stdlib) or "site-packages" in path
                or "dist-packages" in path)


def where(frame: types.FrameType | None) -> str:
    """The innermost plugin code on the stack of ``frame`` ("forward in hang.py, line 24"), else the
    innermost frame's; empty without a frame."""
    innermost = frame
    while frame is not None:
        if _is_plugin_frame(frame):
            return f"{frame.f_code.co_name} in {Path(frame.f_code.co_filename).name}, line {frame.f_lineno}"
        frame = frame.f_back
    if innermost is None:
        return ""
    return f"{innermost.f_code.co_name} in {Path(innermost.f_code.co_filename).name}, line {innermost.f_lineno}"


def message(what: str, seconds: float, stuck: str) -> str:
    at = f"; it was in {stuck}" if stuck else ""
    return (f"{what} did not return within {seconds:g} s{at}. A plugin's code that never returns (a loop, "
            f"a wait) hangs here; fix the plugin, or give it longer with abl run --plugin-timeout SECONDS "
            f"(any command: {TIMEOUT_ENV}=SECONDS)")


# the limit time_limit takes when it is given none (abl run --plugin-timeout sets it; 0: no limit)
plugin_timeout_s: float = DEFAULT_PLUGIN_TIMEOUT_S


def set_plugin_timeout(seconds: float) -> None:
    global plugin_timeout_s
    plugin_timeout_s = float(seconds)


def _hard_exit(line: str, code: int) -> None:
    """From the watchdog thread: say why, run the registered clean-ups (the store's lock), and end the process."""
    print(line, file=sys.stderr, flush=True)
    for fn in list(_hard_exits):
        try:
            fn()
        except Exception:  # noqa: BLE001 - the exit must happen whatever a clean-up does
            pass
    os._exit(code)


@contextmanager
def time_limit(what: str, seconds: float | None = None) -> Iterator[None]:
    """Run the block under a limit of ``seconds`` (default: ``plugin_timeout_s``; <= 0: none); raises
    ``PluginTimeout`` past it.

    A watchdog thread stands by while the block runs: when the main thread is stuck in native code, no
    signal handler can run, so the watchdog ends the process itself: ``NATIVE_GRACE_S`` (``ABL_NATIVE_GRACE_S``)
    past the limit
    (exit 2), or ``STOP_GRACE_S`` after a SIGTERM or SIGINT that the main thread did not act on (exit
    130). It learns of the signals from Python's wakeup fd (``signal.set_wakeup_fd``), written by the C
    handler whatever the main thread does.

    Main thread only (SIGALRM and the handlers run there); in another thread, or inside another limit,
    the block runs as it is."""
    seconds = plugin_timeout_s if seconds is None else seconds
    if threading.current_thread() is not threading.main_thread() or signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        yield
        return
    limited = bool(seconds and seconds > 0)
    grace = native_grace_s()
    done = threading.Event()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)

    def on_alarm(signum, frame):
        raise PluginTimeout(message(what, seconds, where(frame)))

    def watchdog() -> None:
        deadline = time.monotonic() + seconds + grace if limited else None
        stop_at, stopped_by = None, ""
        while not done.is_set():
            ends = [t for t in (deadline, stop_at) if t is not None]
            wait = min(0.5, max(0.0, min(ends) - time.monotonic())) if ends else 0.5
            ready, _, _ = select.select([wake_r], [], [], wait)
            if done.is_set():
                return
            if ready:
                got = [b for b in os.read(wake_r, 64) if b in (signal.SIGTERM, signal.SIGINT)]
                if got and stop_at is None:
                    stop_at, stopped_by = time.monotonic() + STOP_GRACE_S, signal_name(got[0])
            now = time.monotonic()
            if stop_at is not None and now >= stop_at:
                _hard_exit(f"stopped by {stopped_by} while {what} was stuck in native code (plugin code that "
                           f"did not give the interpreter back); nothing was trained", 130)
            if deadline is not None and now >= deadline:
                _hard_exit(f"error: {message(what, seconds, 'native code that did not give the interpreter back')}",
                           2)

    previous = signal.signal(signal.SIGALRM, on_alarm) if limited else None
    previous_fd = signal.set_wakeup_fd(wake_w)
    thread = threading.Thread(target=watchdog, name="abl-plugin-watchdog", daemon=True)
    thread.start()
    if limited:
        signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        if limited:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        done.set()
        try:  # wake the watchdog from its wait, so leaving the block costs no wait
            os.write(wake_w, b"\0")
        except OSError:
            pass
        signal.set_wakeup_fd(previous_fd)
        thread.join(2.0)
        os.close(wake_r)
        os.close(wake_w)
