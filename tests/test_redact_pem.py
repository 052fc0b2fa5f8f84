"""A PEM private key in a job's text (issue 34, the fourth round): on one line amid prose, its body
on the lines after a BEGIN that sits mid-line, each body line behind the prefix a launcher or a
logger puts on every line (torchrun's ``[rank0]:``, a timestamp), quoted, and as the consecutive
strings of a list (a status's or an event's sample lines), at the real sinks' gate."""
from __future__ import annotations

import time

from supervisor.redact import REDACTED, LineMasker, redact_data, redact_line, redact_lines, redact_text
from supervisor.redactpem import PEM_MAX_LINES, mask_keys

BODY = ["MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7zqP1xLineOne0abcdEFGH",
        "zqP2xLineTwo9Rst8Uvw7Xyz6AbC5dEf4GhI3jKl2MnO1pQr0StU+/=",
        "zqP3xLast=="]  # the last line of a body is short: no rule for a line alone sees it


def leaked(shown: list[str] | str) -> list[str]:
    text = "\n".join(shown) if isinstance(shown, list) else shown
    return [m for m in ("zqP1x", "zqP2x", "zqP3x") if m in text]


def test_a_key_on_one_line_in_prose_is_masked_and_the_words_after_it_kept() -> None:
    line = f"config dump: -----BEGIN PRIVATE KEY----- {' '.join(BODY)} -----END PRIVATE KEY----- step 5 loss 2.1"
    assert redact_line(line) == f"config dump: {REDACTED} step 5 loss 2.1"
    assert redact_text(line) == f"config dump: {REDACTED} step 5 loss 2.1"
    # quoted pieces, a header and a body token apart: each goes
    assert not leaked(redact_line(f"dump '-----BEGIN PRIVATE KEY-----' '{BODY[0]}' '{BODY[1]}'"))


def test_body_lines_after_a_header_mid_line_are_masked_behind_each_lines_prefix() -> None:
    for prefix in ("", "[rank0]: ", "[default3]:", "2026-12-07 21:00:01,123 INFO ", "  "):
        lines = [f"{prefix}INFO config dump: tls_key=-----BEGIN RSA PRIVATE KEY-----",
                 *(f"{prefix}{b}" for b in BODY), f"{prefix}-----END RSA PRIVATE KEY----- password=zqP1xafter",
                 f"{prefix}step 6 loss 2.1"]
        shown = redact_lines(lines)
        assert not leaked(shown), (prefix, shown)
        assert shown[-1] == f"{prefix}step 6 loss 2.1", shown
        # a later stamp or another rank is the same prefix: digits are read alike
        other = prefix.replace("0", "1")
        shown = redact_lines([lines[0], *(f"{other}{b}" for b in BODY)])
        assert not leaked(shown) and all(s.startswith(other.strip()) for s in shown[1:]), (prefix, shown)
        assert shown[1] == f"{other}{REDACTED}"


def test_quoted_body_lines_a_key_printed_as_a_list_of_its_lines() -> None:
    lines = ["key_lines = [", "    '-----BEGIN PRIVATE KEY-----',", *(f"    '{b}'," for b in BODY), "]",
             "step 7 loss 2.0"]
    shown = redact_lines(lines)
    assert not leaked(shown) and shown[-2:] == ["]", "step 7 loss 2.0"], shown


def test_the_block_ends_at_the_first_line_that_is_no_keys_and_at_its_bound() -> None:
    shown = redact_lines(["[rank0]: key: -----BEGIN PRIVATE KEY-----", f"[rank0]: {BODY[0]}",
                          "[rank0]: step 8 | loss 2.1", "[rank0]: step 9 | loss 2.0"])
    assert shown[2:] == ["[rank0]: step 8 | loss 2.1", "[rank0]: step 9 | loss 2.0"], shown
    masker = LineMasker()
    shown = [masker.line(x) for x in ["x -----BEGIN PRIVATE KEY-----", *["AAAA"] * PEM_MAX_LINES, "Done"]]
    assert shown[-1] == "Done"


def test_a_list_of_strings_at_the_gate_is_one_stream() -> None:
    # an event's or a status's sample lines: each string went through the gate alone, so the
    # key's short last line and its END line were shown
    samples = ["tls: -----BEGIN PRIVATE KEY-----", *BODY, "-----END PRIVATE KEY-----", "step 3 loss 2.2"]
    shown = redact_data({"samples": samples, "nested": [{"x": 1}, ("[rank0]: -----BEGIN PRIVATE KEY-----",
                                                                   f"[rank0]: {BODY[2]}")]})
    assert not leaked(str(shown)), shown
    assert shown["samples"][-1] == "step 3 loss 2.2" and shown["nested"][0] == {"x": 1}
    assert isinstance(shown["nested"][1], tuple)


def test_random_base64_amid_prose_goes_and_names_and_paths_stay() -> None:
    assert mask_keys(f"FORGED {BODY[0]}") == f"FORGED {REDACTED}"
    assert mask_keys(f"x\r{BODY[1]} tail") == f"x\r{REDACTED} tail"
    for kept in ("built TransformerEncoderLayer2WithAttentionPoolingHead ok",
                 "from /mnt/Data/Experiments/run2024/checkpoints/Step1000 at step 5",
                 "commit 3f2a9c1e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a39 sha256=9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822c",
                 "ca: -----BEGIN CERTIFICATE-----"):
        assert mask_keys(kept) == kept


def test_the_stream_rules_stay_linear_on_hostile_lines() -> None:
    t0 = time.process_time()
    redact_lines(["a" * 100 + " -----BEGIN PRIVATE KEY-----"] + ["a" * 100 + "A1" * 2000] * 300)
    redact_lines(["-----BEGIN PRIVATE KEY-----" * 150] * 200)
    mask_keys(("Ab1" * 30 + " ") * 30_000)
    mask_keys("A" * 1_000_000)
    assert time.process_time() - t0 < 5.0


def test_a_body_line_with_a_space_inside_is_masked_as_body_and_prose_still_ends_the_block() -> None:
    """The seventh review: a key pasted or wrapped with a space inside a body line (``MIIE... abc...``)
    ended the block unsaid, and the line went out as it was. Its parts together read as key material
    (16+ characters, both cases and a digit): body; words ("step 5 of 10", "epoch done") end it."""
    spaced = ["MIIEowIBAAKCAQEA zqP1xSpaced0abcDEF123", "zqP2xTwo9Rst8 Uvw7Xyz6AbC5dEf4GhI3 jKl2", "zqP3xLast=="]
    for prefix in ("", "[rank0]: ", "2026-12-07 21:00:01,123 INFO "):
        lines = [f"{prefix}key: -----BEGIN RSA PRIVATE KEY-----", *(f"{prefix}{b}" for b in spaced),
                 f"{prefix}-----END RSA PRIVATE KEY-----", f"{prefix}step 6 loss 2.1"]
        shown = redact_lines(lines)
        assert not leaked(shown) and shown[-1] == f"{prefix}step 6 loss 2.1", (prefix, shown)
    quoted = redact_lines(["'-----BEGIN PRIVATE KEY-----',", f"'{spaced[0]}',", f"'{spaced[1]}',"])
    assert not leaked(quoted), quoted
    for prose in ("step 5 of 10", "epoch done", "Step 5 Done ok"):
        shown = redact_lines(["-----BEGIN PRIVATE KEY-----", spaced[0], prose, "zqP3xLast=="])
        assert shown[2] == prose and "zqP1x" not in shown[1], shown
    t0 = time.process_time()
    redact_lines(["-----BEGIN PRIVATE KEY-----", *[("aB3 " * 1000)] * 300])
    assert time.process_time() - t0 < 5.0
