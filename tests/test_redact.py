"""Redaction: corpus of secrets and look-alikes, argv / mapping forms, streaming, speed, safety."""

from __future__ import annotations

import base64
import itertools
import random
import time
from pathlib import Path

import pytest
import tomllib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuledger.core.redaction.redact import LineRedactor, RedactionRuleError, Redactor, _State

CORPUS_PATH = Path(__file__).parent / "data" / "redaction_corpus.toml"
RULES_PATH = Path(__file__).parents[1] / "src" / "gpuledger" / "core" / "redaction" / "redact_rules.toml"


def _joined(value: str | list[str]) -> str:
    # Token-like corpus strings are stored in parts so secret scanners skip the repository.
    return "".join(value) if isinstance(value, list) else value


def _load_corpus() -> tuple[list[dict], list[dict]]:
    doc = tomllib.loads(CORPUS_PATH.read_text(encoding="utf-8"))
    positives = [
        {"rule": p["rule"], "input": _joined(p["input"]), "expected": _joined(p["expected"])} for p in doc["positive"]
    ]
    return positives, doc["negative"]


POSITIVES, NEGATIVES = _load_corpus()
R = Redactor.default()


def _id(case: dict) -> str:
    return case.get("rule", "") + ":" + case["input"][:40]


# -- corpus -------------------------------------------------------------------------------------


def test_every_rule_has_a_positive_and_enough_negatives() -> None:
    covered = {p["rule"] for p in POSITIVES}
    assert {r.name for r in R.rules} <= covered
    assert len(NEGATIVES) >= 40
    for p in POSITIVES:
        assert f"[REDACTED:{p['rule']}]" in p["expected"], p


@pytest.mark.parametrize("case", POSITIVES, ids=_id)
def test_positive(case: dict) -> None:
    assert R.redact_text(case["input"]) == case["expected"]
    data = case["input"].encode()
    assert R.redact_bytes(data) == case["expected"].encode()


@pytest.mark.parametrize("case", POSITIVES, ids=_id)
def test_redacting_twice_changes_nothing(case: dict) -> None:
    once = R.redact_text(case["input"])
    assert R.redact_text(once) == once


@pytest.mark.parametrize("case", NEGATIVES, ids=_id)
def test_negative_left_alone(case: dict) -> None:
    text = case["input"]
    assert R.redact_text(text) == text
    assert R.redact_bytes(text.encode()) == text.encode()
    assert R.redact_argv(text.split(" ")) == text.split(" ")


@pytest.mark.parametrize("rule", R.rules, ids=lambda r: r.name)
def test_rule_file_example(rule) -> None:
    assert rule.example and rule.description
    assert R.redact_text(rule.example) == rule.expected


def test_keywords_occur_in_every_match() -> None:
    """The prefilter only searches lines holding a keyword (and the anchor, if any): every match
    must contain them."""
    texts = [p["input"] for p in POSITIVES] + [r.example for r in R.rules]
    for rule in R.rules:
        if rule.regex is None:
            continue
        for text in texts:
            for m in rule.regex.finditer(text.encode()):
                found = m.group(0).lower()
                assert any(k in found for k in rule.keywords), (rule.name, m.group(0))
                assert rule.anchor is None or rule.anchor.search(found), (rule.name, m.group(0))


def test_overlapping_finds_are_redacted_to_the_furthest_end() -> None:
    """Two rules' finds that overlap, the one starting first ending first: the redaction runs to
    the later end, else the rest of the longer secret would be left in the output."""
    rules = Redactor.from_toml(
        """
[[rule]]
name = "short"
regex = '''(abcd)'''
keywords = ["abcd"]
[[rule]]
name = "long"
regex = '''(cdefghij)'''
keywords = ["cdef"]
"""
    )
    assert rules.redact_text("x abcdefghij y") == "x [REDACTED:short] y"
    assert rules.redact_bytes(b"x abcdefghij y\n") == b"x [REDACTED:short] y\n"


def _base64_fixed(word: bytes) -> list[str]:
    """The base64 characters that ``word`` alone fixes, at each of the three byte alignments."""
    out = []
    for align in range(3):
        enc = base64.b64encode(b"\0" * align + word + b"\0\0\0").decode()
        out.append("".join(c for i, c in enumerate(enc) if 6 * i >= 8 * align and 6 * i + 6 <= 8 * (align + len(word))))
    return out


_B64_WORDS = [
    (case + sep).encode()
    for word in ("password", "passwd", "secret", "token")
    for case in (word, word.upper(), word.capitalize())
    for sep in "=:"
]


def test_base64_fragment_is_the_words_encoded() -> None:
    fragment = tomllib.loads(RULES_PATH.read_text(encoding="utf-8"))["fragments"]["b64word"]
    expected = {fixed for word in _B64_WORDS for fixed in _base64_fixed(word)}
    assert set(fragment.removeprefix("(?:").removesuffix(")").split("|")) == expected
    # Every encoded word holds one of the rule's keywords, so the prefilter never hides a match.
    rule = next(r for r in R.rules if r.name == "base64-credential")
    assert all(any(k in f.lower().encode() for k in rule.keywords) for f in expected)


@pytest.mark.parametrize("word", _B64_WORDS, ids=lambda w: w.decode())
def test_base64_credential_at_every_alignment(word: bytes) -> None:
    for prefix in (b"", b"x", b"db_", b"user=ml\n"):
        plain = base64.b64encode(prefix + word + b"hunter2-s3cr3t").decode()
        url = base64.urlsafe_b64encode(prefix + word + b"q?>~").decode()
        assert R.redact_text(plain) == "[REDACTED:base64-credential]"
        assert R.redact_text(f"conf {plain} end") == "conf [REDACTED:base64-credential] end"
        assert R.redact_text(f"X={url};") == "X=[REDACTED:base64-credential];"


# -- argv and mappings --------------------------------------------------------------------------


def test_argv_two_item_form() -> None:
    argv = ["python", "train.py", "--password", "hunter2", "--epochs", "100", "--hf-token", "abc"]
    assert R.redact_argv(argv) == [
        "python", "train.py", "--password", "[REDACTED:secret-flag]", "--epochs", "100",
        "--hf-token", "[REDACTED:secret-flag]",
    ]  # fmt: skip


def test_argv_forms() -> None:
    argv = [
        "--max-tokens", "512",  # a count, not a token
        "--token", "--verbose",  # a flag with no value before the next flag: nothing to hide
        "--api-key=abc123",
        "--secret", "",
        "bash", "-c", "python train.py --password hunter2",
        "HF_TOKEN=abc",
        "--token",  # last item: nothing follows
    ]  # fmt: skip
    assert R.redact_argv(argv) == [
        "--max-tokens", "512",
        "--token", "--verbose",
        "--api-key=[REDACTED:secret-flag]",
        "--secret", "",
        "bash", "-c", "python train.py --password [REDACTED:secret-flag]",
        "HF_TOKEN=[REDACTED:env-secret]",
        "--token",
    ]  # fmt: skip


def test_argv_mysql_password_across_items() -> None:
    """``-pSECRET`` and ``-p SECRET`` after a mysql-family program, each item seen alone by the
    text rules; ``-p`` elsewhere (a port, a parallelism) and after the command ended is kept."""
    argv = ["/usr/bin/mysqldump", "-u", "ml", "-pS3cr3t", "db", "|", "gzip", "-p", "4"]
    assert R.redact_argv(argv) == [
        "/usr/bin/mysqldump", "-u", "ml", "-p[REDACTED:mysql-password]", "db", "|", "gzip", "-p", "4",
    ]  # fmt: skip
    assert R.redact_argv(["mariadb", "-p", "hunter2", "shop"]) == ["mariadb", "-p", "[REDACTED:mysql-password]", "shop"]
    assert R.redact_argv(["mysql", "-p", "-h", "db"]) == ["mysql", "-p", "-h", "db"]  # prompts: nothing to hide
    assert R.redact_argv(["mysqladmin", "ping;", "ssh", "-p", "22"]) == ["mysqladmin", "ping;", "ssh", "-p", "22"]
    assert R.redact_argv(["python", "-m", "http.server", "-p", "8080"]) == ["python", "-m", "http.server", "-p", "8080"]
    once = R.redact_argv(["mysql", "-psecret", "-p", "x"])
    assert R.redact_argv(once) == once


def test_mapping_by_key_and_by_value() -> None:
    labels = {
        "HF_TOKEN": "abc",
        "db.password": "x",
        "PGPASSWORD": "y",
        "team": "vision",
        "PWD": "/home/ml",
        "max_tokens": "512",
        "note": "connect with password=hunter2",
        "empty_token": "",
        "count": 3,
    }
    assert R.redact_mapping(labels) == {
        "HF_TOKEN": "[REDACTED:secret-key-name]",
        "db.password": "[REDACTED:secret-key-name]",
        "PGPASSWORD": "[REDACTED:secret-key-name]",
        "team": "vision",
        "PWD": "/home/ml",
        "max_tokens": "512",
        "note": "connect with password=[REDACTED:password]",
        "empty_token": "",
        "count": 3,
    }


def test_tree_redacts_nested_metadata() -> None:
    meta = {
        "trainer": {"args": ["--lr", "0.01", "--api-key=abc123"], "wandb": {"api_key": "k", "project": "p"}},
        "env": [{"HF_TOKEN": "abc"}, "DB_PASSWORD=hunter2"],
        "epochs": 100,
        "ok": True,
        "none": None,
        "note": "plain text",
    }
    assert R.redact_tree(meta) == {
        "trainer": {
            "args": ["--lr", "0.01", "--api-key=[REDACTED:secret-flag]"],
            "wandb": {"api_key": "[REDACTED:secret-key-name]", "project": "p"},
        },
        "env": [{"HF_TOKEN": "[REDACTED:secret-key-name]"}, "DB_PASSWORD=[REDACTED:password]"],
        "epochs": 100,
        "ok": True,
        "none": None,
        "note": "plain text",
    }
    assert R.redact_tree(R.redact_tree(meta)) == R.redact_tree(meta)


def test_real_gpuledger_tokens_are_redacted_everywhere(tmp_path: Path) -> None:
    """A token as ``gpuledger admin token issue`` makes it, bare, in argv, labels, metadata and logs."""
    from gpuledger.store import Ledger, accounts

    with Ledger(tmp_path / "ledger.db") as led:
        token = accounts.issue_token(led, "root", role="admin", actor="test", create_user=True)[1]
    token_id, secret = token[4:16], token[17:]
    kept = f"glt_{token_id}_[REDACTED:gpuledger-token]"
    assert R.redact_text(f"retrying with {token}.") == f"retrying with {kept}."
    assert R.redact_argv(["gpuledger", "sync", token]) == ["gpuledger", "sync", kept]
    assert R.redact_mapping({"note": token}) == {"note": kept}
    assert R.redact_tree({"deep": [{"x": token}]}) == {"deep": [{"x": kept}]}
    assert secret.encode() not in R.redact_bytes(b"log: " + token.encode() + b"\nnext line\n")


# -- bytes ------------------------------------------------------------------------------------


def test_binary_garbage_survives_byte_for_byte() -> None:
    rnd = random.Random(7)
    junk = bytes(rnd.randrange(256) for _ in range(4000)).replace(b"\x1b", b"")
    secret = b"\nDB_PASSWORD=hunter2\n"
    data = junk[:2000] + secret + junk[2000:]
    assert R.redact_bytes(data) == junk[:2000] + b"\nDB_PASSWORD=[REDACTED:password]\n" + junk[2000:]


def test_invalid_utf8_inside_a_secret_is_redacted_whole() -> None:
    assert R.redact_bytes(b"password=ab\xff\xfecd rest\x80") == b"password=[REDACTED:password] rest\x80"


def test_text_with_lone_surrogates_round_trips() -> None:
    text = "log \udcff\udc80 password=x \ud800 end"
    assert R.redact_text(text) == "log \udcff\udc80 password=[REDACTED:password] \ud800 end"


# -- streaming ----------------------------------------------------------------------------------

_PEM = (
    b"-----BEGIN RSA PRIVATE " + b"KEY-----\n",
    b"MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\n",
    b"VTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxK==\n",
    b"-----END RSA PRIVATE " + b"KEY-----\n",
)
_FRAGMENTS = (
    [p["input"].encode() for p in POSITIVES]
    + [n["input"].encode() for n in NEGATIVES]
    + list(_PEM)
    + [
        b"\n",
        b"\r",
        b"\r\n",
        b" ",
        b"=",
        b"\x1b[0m",
        b"\x1b[32m",
        b"password",
        b"TOKEN",
        b"--token ",
        b"key=",
        b"Token: ",
        b"tokens/s",
    ]
)
_logs = st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.binary(max_size=12)), max_size=30).map(b"".join)


def _chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def _stream(chunks: list[bytes], **kwargs) -> bytes:
    lr = LineRedactor(R, **kwargs)
    return b"".join(lr.feed(c) for c in chunks) + lr.flush()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_logs, cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_stream_equals_whole_for_any_chunking(data: bytes, cuts: list[int]) -> None:
    assert _stream(_chunked(data, cuts)) == R.redact_bytes(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_logs)
def test_prefilter_never_changes_the_result(data: bytes) -> None:
    assert R._redact(data, _State()) == R._redact(data, _State(), prefilter=False)


_CUT_SECRETS = [
    (b"password=hunter2hunter2", b"hunter2hunter2"),
    (b"sk-" + b"proj-Ab1Cd2Ef3Gh4Ij5Kl6Mn7_Op8Qr9St0Uv-WxYz0123", b"Op8Qr9St0Uv"),
    (b"HF_TOKEN=hf" + b"_AbCdEfGhIjKlMnOpQrStUvWxYz01234567", b"OpQrStUvWxYz"),
    (b"aws_secret_access_key wJalrXUtnFEMI/K7MDENG/" + b"bPxRfiCYEXAMPLEKEY", b"CYEXAMPLEKEY"),
]


@pytest.mark.parametrize("secret,core", _CUT_SECRETS, ids=lambda s: s[:12].decode())
def test_stream_cut_of_a_long_line_never_splits_a_secret(secret: bytes, core: bytes) -> None:
    """A line longer than max_line_bytes with no blank to cut after: wherever the cut falls (the
    secret before, across or after it; fed byte by byte or in chunks), the secret is redacted
    whole and every other byte comes out once."""
    cap = 4096
    for size in range(cap - 1100, cap + 40, 7):
        data = b"x" * size + b"," + secret + b"," + b"y" * 3000 + b"\n"
        for chunk in (1, 700, 4096) if size % 5 == 0 else (700,):
            out = _stream([data[i : i + chunk] for i in range(0, len(data), chunk)], max_line_bytes=cap)
            assert core not in out, (size, chunk)
            assert out == R.redact_bytes(data), (size, chunk)


def test_stream_byte_by_byte_keeps_pem_state_across_lines() -> None:
    data = b"start\r\n" + b"".join(_PEM) + b"end\n" + b"".join(_PEM[:2]) + b"tail"
    whole = R.redact_bytes(data)
    assert _stream([data[i : i + 1] for i in range(len(data))]) == whole
    assert whole.count(b"[REDACTED:private-key]") == 4
    assert b"MIIE" not in whole


def test_stream_memory_stays_bounded_on_huge_lines() -> None:
    cap = 64 * 1024
    line = b"".join(b"word%d " % i for i in range(400_000))  # ~3.5 MB, no line end
    lr = LineRedactor(R, max_line_bytes=cap)
    out = []
    for i in range(0, len(line), 10_000):
        out.append(lr.feed(line[i : i + 10_000]))
        assert lr.pending <= cap
    out.append(lr.flush())
    assert b"".join(out) == line
    # A forced cut happens after a blank, so the words themselves are never split.
    assert all(piece.endswith(b" ") for piece in out[:-1] if piece)


def test_stream_redacts_across_chunk_boundaries_and_passes_ansi() -> None:
    data = b"\x1b[32mepoch 1\x1b[0m\r\x1b[1mHF_TOKEN=abc123\x1b[0m\nok\n"
    expected = b"\x1b[32mepoch 1\x1b[0m\r\x1b[1mHF_TOKEN=[REDACTED:env-secret]\x1b[0m\nok\n"
    for size in (1, 2, 3, 7, 64):
        assert _stream([data[i : i + size] for i in range(0, len(data), size)]) == expected


# -- rule files ---------------------------------------------------------------------------------


def test_from_file_uses_the_given_rules(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(
        """
[fragments]
v = '''[A-Z]+'''
[[rule]]
name = "ticket"
regex = '''TICKET-({{v}})'''
group = 1
keywords = ["ticket-"]
""",
        encoding="utf-8",
    )
    r = Redactor.from_file(path)
    assert r.redact_text("see TICKET-ABC and password=x") == "see TICKET-[REDACTED:ticket] and password=x"
    assert Redactor.from_file(RULES_PATH).redact_text("password=x") == "password=[REDACTED:password]"


@pytest.mark.parametrize(
    "body",
    [
        '[[rule]]\nname = "a"\nregex = "x(y"\nkeywords = ["x"]',  # bad regex
        '[[rule]]\nname = "a"\nregex = "xy"\ngroup = 1\nkeywords = ["x"]',  # no such group
        '[[rule]]\nname = "a"\nregex = "(x)"\nkeywords = ["X"]',  # keywords must be lower-case
        '[[rule]]\nname = "a"\nregex = "(x)"\nkeywords = []',  # a rule needs keywords
        '[[rule]]\nname = "a"\nregex = "({{nope}})"\nkeywords = ["x"]',  # unknown fragment
        '[[rule]]\nname = "a"\nregex = "(x)"\nkeywords = ["x"]\n[[rule]]\nname = "a"\nregex = "(y)"\n'
        'keywords = ["y"]',  # duplicate name
        '[[rule]]\nname = "Bad Name"\nregex = "(x)"\nkeywords = ["x"]',
        "not toml ===",
    ],
)
def test_bad_rule_files_are_refused(body: str) -> None:
    with pytest.raises(RedactionRuleError):
        Redactor.from_toml(body)


# -- speed and safety ---------------------------------------------------------------------------


def _typical_log(size: int) -> bytes:
    """An Ultralytics-like training log: colour codes, \\r progress bars, URLs, metrics."""
    rnd = random.Random(0)
    parts = [
        "\x1b[34m\x1b[1mengine/trainer: \x1b[0mtask=detect, mode=train, model=yolov8n.pt, "
        "data=coco128.yaml, epochs=100, batch=16, imgsz=640, device=0, workers=8, lr0=0.01\n"
        "\x1b[34m\x1b[1mAMP: \x1b[0mchecks passed ✅\n"
        "Downloading https://github.com/ultralytics/assets/releases/download/v8.1.0/yolov8n.pt\n"
    ]
    total = len(parts[0])
    epoch = 0
    while total < size:
        epoch += 1
        for step in range(1, 9):
            bar = (
                f"\r{epoch:>7}/100      2.61G      {rnd.random():.4f}      {rnd.random() * 3:.4f}"
                f"        {rnd.randint(50, 250)}        640: {step * 12}%|██▍       | {step}/8 "
                f"[00:0{step}<00:01,  5.12it/s]"
            )
            parts.append(bar)
            total += len(bar)
        val = (
            "\n                 Class     Images  Instances      Box(P          R      mAP50  "
            "mAP50-95): 100%|██████████| 4/4 [00:00<00:00,  7.91it/s]\n"
            f"                   all        128        929      0.{rnd.randint(100, 999)}      "
            f"0.{rnd.randint(100, 999)}\n"
        )
        parts.append(val)
        total += len(val)
    return "".join(parts).encode()[:size]


def test_benchmark_10mb_typical_log(capsys: pytest.CaptureFixture[str]) -> None:
    data = _typical_log(10_000_000)
    start = time.perf_counter()
    out = R.redact_bytes(data)
    whole = time.perf_counter() - start
    start = time.perf_counter()
    lr = LineRedactor(R)
    streamed = b"".join(lr.feed(data[i : i + 65536]) for i in range(0, len(data), 65536)) + lr.flush()
    stream = time.perf_counter() - start
    assert out == data and streamed == data
    with capsys.disabled():  # shown once in the test output; timing is not asserted
        print(f"\n[redact benchmark] 10 MB typical log: redact_bytes {whole:.3f} s, stream 64 KiB {stream:.3f} s")


def _adversarial_lines(size: int) -> dict[str, bytes]:
    keywords = sorted({k.decode() for rule in R.rules for k in rule.keywords})
    examples = "".join(r.example for r in R.rules).replace("\n", " ")
    pieces = {
        "keywords": " ".join(keywords) + " ",
        "keywords glued": "".join(keywords),
        "examples glued": examples.replace(" ", ""),
        "pem one line": "-----BEGIN PRIVATE " + "KEY-----\\nMIIE\\n-----END PRIVATE " + "KEY-----",
        "assignments": "password=token=secret=api_key=://a:b--token ",
        "runs": "a.a_a-a:a/a",
    }
    lines = {name: (p * (size // len(p) + 1))[:size].encode() for name, p in pieces.items()}
    for kw in ("secret", "://", "--token ", "wandb login ", "bearer "):
        lines[f"{kw!r} + spaces"] = (kw + " " * size)[:size].encode()
        lines[f"{kw!r} + word"] = (kw + "a" * size)[:size].encode()
    return lines


@pytest.mark.parametrize("name", list(_adversarial_lines(10)))
def test_5mb_adversarial_line_finishes(name: str) -> None:
    """A quadratic pattern would take hours here; the bound only catches that, not speed."""
    data = _adversarial_lines(5_000_000)[name]
    start = time.perf_counter()
    R.redact_bytes(data)
    assert time.perf_counter() - start < 60
