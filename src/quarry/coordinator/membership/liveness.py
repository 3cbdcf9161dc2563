"""How the host knows a device is still there: silence, not duration, decides.

A killed device's kernel resets its connections, so the host hears of the loss at once. A
partition (a pulled cable, a dead switch port, a powered-off host) resets nothing: a call on it
waits for an answer that never comes. So every channel to a device runs gRPC keepalive, which
also sets the kernel's TCP_USER_TIMEOUT: data the host sent that the device's kernel has not
acknowledged within ``keepalive_timeout`` closes the connection, and every call on it fails at
once, whatever it was (an action, a scan, a work exchange, an ingest's put). While bytes flow the
host always has some in flight (window updates, flow-control pings, the rows of an ingest); on
a quiet connection gRPC sends a ping after ``keepalive_time`` without data. The two add up to
``QUARRY_DEVICE_SILENCE_S``: a device whose link stays silent that long is lost, and its work
fails over exactly as a killed one's does. A device that answers is alive however long its work
takes (a ten-minute scan on a slow drive sends nothing for minutes), and a link that is slow
but moving is never taken for silence: what is measured is the kernel's acknowledgements, which
do not wait behind the rows queued on a saturated link (an HTTP/2 ping's answer does: pings
are given gRPC's own 60 s, so a drive far behind on a slow shared link is not declared lost).

gRPC servers take frequent pings for abuse ("too_many_pings": after a few pings with no data
sent back, the server closes the connection) unless they are told otherwise, and pyarrow's
Flight server takes no such option. Data the server writes resets that count, so every client
keeps one stream open on which the device writes an empty batch every ``period_s``
(``Heartbeat``, the ``heartbeat`` ticket): the pings then always follow data.

Measured on this machine (pyarrow 26's gRPC; a device in a network namespace, its veth's root
end set down): calls across the cut failed 3.0 s after it with keepalive 2 s + 3 s, and not in
12 s without keepalive; a 25-second silent action passed with the heartbeat stream open, and
was cut "too_many_pings" after 10 s without it. A process stopped while its kernel still
answers (SIGSTOP) is not silence to TCP: its calls end at their deadlines (the silence bound for
hello and pulse) or at gRPC's 60-second ping timeout; holding every ping to 3 s found it in 4.9
s, but then declared drives lost on a saturated shaped link, so it is not done.

After a partition heals the channel connects again by itself: its reconnection back-off is held
to a fraction of the bound, and each connection attempt gives up after the rest, so a device
that comes back is reached within about the bound.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyarrow import flight

from quarry import settings
from quarry.errors import DeviceSilent

# The silence bound split: a ping every 40% of it, the answer awaited for 60% of it; the
# device writes a heartbeat every 20% (half the ping interval, so that a ping never follows
# another without data between them, however the two clocks fall).
KEEPALIVE_SHARE = 0.4
HEARTBEAT_SHARE = 0.2
RECONNECT_BACKOFF_SHARE = 0.2  # the longest wait between connection attempts
HEARTBEAT_LIFETIME_S = 300.0  # a heartbeat stream ends after this; the client opens another
STOP_JOIN_S = 1.0  # how long stop() waits for the heartbeat thread to end
# words gRPC and the kernel use for a peer that stopped answering (a deadline, keepalive's
# watchdog, TCP's user timeout): silence, not a refusal
SILENT_WORDS = ("keepalive", "timed out", "timeout", "deadline")


@dataclass(frozen=True)
class Liveness:
    """The figures that bound a device's silence, all from ``silence_s``."""

    silence_s: float

    @classmethod
    def configured(cls) -> Liveness:
        return cls(settings.DEVICE_SILENCE_S.get())

    @property
    def keepalive_ms(self) -> int:
        return round(self.silence_s * KEEPALIVE_SHARE * 1000)

    @property
    def keepalive_timeout_ms(self) -> int:
        return round(self.silence_s * 1000) - self.keepalive_ms

    @property
    def heartbeat_period_s(self) -> float:
        return self.silence_s * HEARTBEAT_SHARE

    def silent(self, name: str, address: str, what: str = "") -> DeviceSilent:
        """The error a device that went silent raises, naming it and the bound."""
        return DeviceSilent(
            f"device {name} at {address} went silent{what}: nothing came back for "
            f"{self.silence_s:g} s ({settings.DEVICE_SILENCE_S.name}); its host or its link may "
            "be down. It is used again as soon as it answers; check `quarry status`."
        )

    def channel_options(self) -> list[tuple[str, int]]:
        """gRPC channel arguments (``FlightClient(generic_options=...)``)."""
        backoff_ms = round(self.silence_s * RECONNECT_BACKOFF_SHARE * 1000)
        return [
            ("grpc.keepalive_time_ms", self.keepalive_ms),
            ("grpc.keepalive_timeout_ms", self.keepalive_timeout_ms),
            # pings only while a call is open (the heartbeat stream is one, while it runs)
            ("grpc.keepalive_permit_without_calls", 0),
            # the client's own limit on pings between its data frames: none (a scan's caller
            # sends nothing for as long as it reads)
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.initial_reconnect_backoff_ms", backoff_ms),
            ("grpc.max_reconnect_backoff_ms", backoff_ms),
            # how long one connection attempt may take (gRPC's default is 20 s)
            ("grpc.min_reconnect_backoff_ms", self.keepalive_timeout_ms),
        ]


def is_silence(error: BaseException) -> bool:
    """Whether a Flight error says the device went silent (rather than refused or failed)."""
    if isinstance(error, flight.FlightTimedOutError):
        return True
    text = str(error).lower()
    return any(word in text for word in SILENT_WORDS)


class Heartbeat:
    """The one stream a client keeps open to its device while it is in use (see the module's
    docstring), opened again when it ends or breaks, until ``stop``. It holds no reference to
    its client, so a client dropped unclosed is collected and stops it (``weakref.finalize``).
    A device that refuses the stream (an older release, a token it does not take) is not asked
    again: its calls fail on their own.

    It also tells a listener (``listen``: the membership) when the device goes silent and when
    it answers again, so a partition is noticed between queries, and a healed link too."""

    def __init__(
        self,
        name: str,
        open_stream: Callable[[], Any],
        liveness: Liveness,
    ) -> None:
        self.name = name
        self._open = open_stream
        self.liveness = liveness
        self.beats = 0  # batches received, all streams together
        self.opened = 0  # streams opened
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._reader: Any = None
        self._thread: threading.Thread | None = None
        self._refused = False
        self.silent = False  # the last stream broke for silence, and none has answered since
        self._listener: weakref.WeakMethod | None = None

    def listen(self, method: Callable[[str, bool], None]) -> None:
        """Call ``method(name, silent)`` when the device goes silent or answers again (held
        weakly: a listener that goes away is not kept alive by this thread)."""
        self._listener = weakref.WeakMethod(method)

    def went_silent(self) -> None:
        """A call on this client found the device silent: its heartbeat says so too from now
        on, until a heartbeat comes in (the heartbeat's own stream may not have broken yet, and
        every call to the device until then would wait out the bound again). Not for a device
        that refused the heartbeat stream: nothing would ever say it answers again."""
        if not self._refused:
            self._changed(silent=True)

    def _changed(self, silent: bool) -> None:
        if self.silent == silent:
            return
        self.silent = silent
        listener = self._listener() if self._listener is not None else None
        if listener is not None:
            listener(self.name, silent)

    def ensure(self) -> None:
        """Running from now on (called before every call: cheap once it runs)."""
        thread = self._thread
        if thread is not None and thread.is_alive():
            return
        with self._lock:
            if self._stop.is_set() or self._refused:
                return
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name=f"quarry-heartbeat-{self.name}", daemon=True
                )
                self._thread.start()

    def stop(self) -> None:
        """No more streams; the one open is cancelled, and its thread given a moment to end
        (``STOP_JOIN_S``), so that closing the client next never pulls the Flight client out
        from under a read still running on it."""
        self._stop.set()
        with self._lock:
            reader = self._reader
            thread = self._thread
        if reader is not None:
            _cancel(reader)
        if thread is not None and thread is not threading.current_thread():
            thread.join(STOP_JOIN_S)  # bounded: a stream still opening ends at its deadline

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                reader = self._open()
                with self._lock:
                    self._reader = reader
                self.opened += 1
                if self._stop.is_set():
                    break
                while True:
                    reader.read_chunk()
                    self.beats += 1
                    failures = 0
                    self._changed(silent=False)
            except StopIteration:  # its lifetime is over: open the next at once
                continue
            except (flight.FlightUnauthenticatedError, flight.FlightServerError):
                self._refused = True  # unknown ticket, or a token it does not take
                return
            except (flight.FlightError, OSError) as error:
                failures += 1
                if not self._stop.is_set() and is_silence(error):
                    self._changed(silent=True)
            finally:
                with self._lock:
                    self._reader = None
            # unreachable for now: ask again, never more often than a heartbeat nor less often
            # than the silence bound (a device that comes back is found within about it)
            wait_s = self.liveness.heartbeat_period_s * failures
            self._stop.wait(min(wait_s, self.liveness.silence_s))

    def __repr__(self) -> str:
        return f"Heartbeat({self.name!r}, {self.opened} opened, {self.beats} beats)"


def _cancel(reader: Any) -> None:
    with contextlib.suppress(flight.FlightError, OSError):
        reader.cancel()
