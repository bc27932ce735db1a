"""Docker adapter, log streams: the wire formats decoded, YOLO output parsed, secrets redacted.

The streams are built here from the Engine API's description of ``/containers/{id}/logs``
(8-byte frame header: stream type, three zero bytes, big-endian uint32 length; a TTY container's
stream raw) and from what Engine 20.10 was seen to send with ``timestamps=1``: every message
starts with ``<RFC3339Nano fixed> ``, and a line longer than 16 KiB arrives as partial messages
without ``\\n``, each with its own timestamp — in the raw stream, in the middle of the line.
"""

from __future__ import annotations

import itertools
import re
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from docker_support import long_progress
from gpuledger.core.redaction.redact import Redactor
from gpuledger.core.training.logcap import MIN_MAX_B, cap_bytes
from gpuledger.core.training.logparse import parse_log
from gpuledger.node.docker_logs import ContainerLog, FrameDecoder, Message, RawDecoder, ScreenLines

YOLO = Path(__file__).parent / "data" / "yolo"
PARTIAL = 16 * 1024  # json-file's buffer: longer lines are logged in pieces
T0_NS = 1796129991_481720880
SECRET = b"WANDB_API_KEY=0123456789abcdef0123456789abcdef01234567"


def stamp(t_ns: int) -> bytes:
    s, ns = divmod(t_ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(s)).encode() + b".%09dZ " % ns


def messages(data: bytes, t0: int = T0_NS) -> list[tuple[int, bytes]]:
    """How the daemon logs ``data``: one message per line, over-long lines in 16 KiB pieces that
    share the line's timestamp (as Engine 20.10 did)."""
    out, t = [], t0
    for line in re.findall(rb"[^\n]*\n|[^\n]+$", data):  # the daemon splits on \n only
        for i in range(0, len(line), PARTIAL):
            out.append((t, line[i : i + PARTIAL]))
        t += 1_000_003
    return out


def multiplexed(msgs: list[tuple[int, bytes]], stream: int = 1) -> bytes:
    out = b""
    for t, body in msgs:
        payload = stamp(t) + body
        out += bytes([stream, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload
    return out


def raw(msgs: list[tuple[int, bytes]]) -> bytes:
    return b"".join(stamp(t) + body for t, body in msgs)


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def decode(decoder, chunks: list[bytes]) -> list[Message]:
    out: list[Message] = []
    for chunk in chunks:
        out += decoder.feed(chunk)
    return out


def joined(msgs: list[Message], stream: int | None = None) -> bytes:
    return b"".join(m.data for m in msgs if stream is None or m.stream == stream)


# -- the two wire formats ----------------------------------------------------------------------------
@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 10**6), max_size=40))
def test_frames_split_anywhere_give_the_same_messages(cuts: list[int]) -> None:
    data = (YOLO / "yolov8n_detect.log").read_bytes()
    msgs = messages(data)
    out = decode(FrameDecoder(), chunked(multiplexed(msgs, 2), cuts))
    assert [(m.stream, m.t_ns, m.data) for m in out] == [(2, t, body) for t, body in msgs]


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 10**7), max_size=40))
def test_a_raw_stream_split_anywhere_loses_its_timestamps_even_mid_line(cuts: list[int]) -> None:
    data = long_progress((YOLO / "yolov8n_detect.log").read_bytes())
    msgs = messages(data)
    assert any(not body.endswith(b"\n") for _, body in msgs)  # partial messages are in the stream
    out = decode(RawDecoder(), chunked(raw(msgs), cuts))
    assert joined(out) == data
    assert {m.t_ns for m in out} <= {t for t, _ in msgs}


def test_stdout_and_stderr_frames_stay_apart() -> None:
    wire = multiplexed([(T0_NS, b"epoch 1\r")], 2) + multiplexed([(T0_NS + 1, b"hello\n")], 1)
    wire += multiplexed([(T0_NS + 2, b"epoch 1 done\n")], 2)
    out = FrameDecoder().feed(wire)
    assert joined(out, 1) == b"hello\n" and joined(out, 2) == b"epoch 1\repoch 1 done\n"


def test_a_stream_that_is_not_multiplexed_is_read_as_raw() -> None:
    # A TTY container's stream starts with a digit of its timestamp, never with a stream type.
    decoder = FrameDecoder()
    out = decode(decoder, [raw([(T0_NS, b"one\n")])[:5], raw([(T0_NS, b"one\n"), (T0_NS + 9, b"two\n")])[5:]])
    assert decoder.fell_back_to_raw and joined(out) == b"one\ntwo\n"


# -- screen lines ------------------------------------------------------------------------------------
def test_redraws_reduce_to_what_the_terminal_shows() -> None:
    lines = ScreenLines()
    assert lines.feed(b"  1/3  0.5G  1.2\r  1/3  0.5G  1.1\r") == []
    assert lines.feed(b"  1/3  0.5G  1.0\r\x1b[K\r\n") == ["  1/3  0.5G  1.0"]


def test_an_endless_line_costs_bounded_memory_and_keeps_the_last_redraw() -> None:
    lines = ScreenLines(max_bytes=4096)
    for i in range(2000):  # 2000 redraws, no newline: ~100 KB
        lines.feed(b"progress %05d ...........................................\r" % i)
        assert len(lines._buf) <= 4096
    assert lines.feed(b"\n") == ["progress 01999 ..........................................."]


def test_binary_garbage_and_a_huge_line_are_cut_not_fatal() -> None:
    lines = ScreenLines(max_bytes=1024)
    out = lines.feed(bytes(range(256)) * 64)  # 16 KiB of binary, no newline
    out += lines.feed(b"\x00\xff\xfe" * 10_000 + b"\nafter\n")
    assert out[-1] == "after" and len(out[0]) <= 1024 and lines.cut_lines >= 1


# -- a container's log, end to end -------------------------------------------------------------------
CAPTURES = ["yolov8n_detect.log", "yolov8n_detect_piped.log", "yolo11n_segment.log", "yolov5_v7.log"]


@pytest.mark.parametrize("name", CAPTURES)
@pytest.mark.parametrize("tty", [False, True])
def test_a_yolo_containers_log_gives_the_epochs_of_the_log_parser(name: str, tty: bool, tmp_path: Path) -> None:
    data = long_progress((YOLO / name).read_bytes())
    msgs = messages(data)
    wire = raw(msgs) if tty else multiplexed(msgs, 2)
    log = ContainerLog("c" * 64, path=tmp_path / "c.log")
    decoder = RawDecoder() if tty else FrameDecoder()
    for chunk in chunked(wire, list(range(0, len(wire), 4093))):
        log.add(decoder.feed(chunk))
    log.finish()
    view = log.view()
    expected = parse_log(data)
    assert expected.epochs  # the capture has finished epochs
    assert view.parsed.epochs == expected.epochs
    assert view.parsed.format == expected.format and view.parsed.final == expected.final
    assert sorted(view.epoch_times) == [e.epoch for e in expected.epochs]
    assert view.done and view.error is None
    assert (tmp_path / "c.log").read_bytes() == Redactor.default().redact_bytes(data)


def test_epochs_are_read_while_the_training_runs() -> None:
    data = (YOLO / "yolov8n_detect_piped.log").read_bytes()  # 3 epochs
    msgs = messages(data)
    log = ContainerLog("c" * 64)
    decoder = FrameDecoder()
    seen = []
    for msg in msgs:
        log.add(decoder.feed(multiplexed([msg])))
        seen.append(len(log.view().parsed.epochs))
    assert seen[-1] == 3 and 0 < seen.index(1) < seen.index(2) < seen.index(3)  # one at a time, in order
    times = log.view().epoch_times
    assert T0_NS / 1e9 < times[1] < times[2] < times[3]  # each at the time its line was logged


def test_secrets_in_the_log_are_redacted_before_the_copy_and_the_parser(tmp_path: Path) -> None:
    log = ContainerLog("c" * 64, path=tmp_path / "c.log")
    secret_lines = b"starting\n" + SECRET + b"\nexport AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n"
    log.add(FrameDecoder().feed(multiplexed(messages(secret_lines))))
    log.finish()
    kept = (tmp_path / "c.log").read_bytes()
    assert b"0123456789abcdef" not in kept and b"wJalrXUtnFEMI" not in kept
    assert b"[REDACTED:" in kept and kept.startswith(b"starting\n")


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(cut=st.floats(0.01, 0.99), tty=st.booleans())
def test_a_follow_broken_anywhere_resumes_without_loss_or_repeat(cut: float, tty: bool) -> None:
    # Long progress lines: the stream may break between two pieces of one line (same timestamp).
    data = long_progress((YOLO / "yolov8n_detect_piped.log").read_bytes(), redraws=200)
    msgs = messages(data)
    encode, decoder = (raw, RawDecoder) if tty else (multiplexed, FrameDecoder)
    wire = encode(msgs)
    log = ContainerLog("c" * 64, path=None)
    log.add(decoder().feed(wire[: int(len(wire) * cut)]))  # the connection drops here, mid-frame or not
    since = log.resume()
    assert since is not None
    t = int(since.replace(".", "")) // 10**9 * 10**9  # as a daemon that reads whole seconds would
    log.add(decoder().feed(encode([m for m in msgs if m[0] >= t])))  # "since" is inclusive
    log.finish()
    view = log.view()
    assert view.bytes == len(data)  # every byte once
    assert view.parsed.epochs == parse_log(data).epochs


def test_the_daemons_error_frame_is_reported_not_parsed() -> None:
    log = ContainerLog("c" * 64)
    log.add(FrameDecoder().feed(multiplexed([(T0_NS, b"error from daemon in stream: log file closed\n")], 3)))
    assert log.view().error == "the daemon reported: error from daemon in stream: log file closed"
    assert log.view().lines == 0


def test_past_its_cap_the_copy_keeps_head_and_tail_and_parsing_goes_on(tmp_path: Path) -> None:
    data = (YOLO / "yolov8n_detect_piped.log").read_bytes() * 40  # ~ 10 x the cap of 64 KiB
    log = ContainerLog("c" * 64, path=tmp_path / "c.log", cap_b=MIN_MAX_B)
    log.add(FrameDecoder().feed(multiplexed(messages(data))))
    log.finish()
    assert (tmp_path / "c.log").stat().st_size <= 3 * MIN_MAX_B and log.view().file_cut
    assert log.capped() == cap_bytes(data, MIN_MAX_B)  # what a wrapped run of the same output stores
    assert log.view().parsed.epochs == parse_log(data).epochs


def test_no_docker_timestamp_survives_in_what_is_kept(tmp_path: Path) -> None:
    data = long_progress((YOLO / "yolo26n_detect.log").read_bytes())
    log = ContainerLog("c" * 64, path=tmp_path / "c.log")
    log.add(RawDecoder().feed(raw(messages(data))))
    log.finish()
    assert not re.search(rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z ", (tmp_path / "c.log").read_bytes())
