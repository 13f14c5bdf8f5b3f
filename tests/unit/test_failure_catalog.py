"""The failure catalog (engines/data/failures.yaml): every signature names its own real line and no other."""
from __future__ import annotations

import re
import string

import pytest

from k3deploy.engines.failures import explain, fill, first_fatal, name_line, signatures

FACTS = ("host", "ip", "iface", "rank")  # what launch knows of the failed node
DERIVED = ("tp_choices", "ep_choices", "signal")
# The categories issue 39 asks the catalog to cover, each with a signature id that covers it.
REQUIRED = ("gloo-iface-unknown", "gloo-mesh-failed", "nccl-bootstrap-no-iface", "nccl-watchdog-timeout",
            "nccl-ib-completion-error", "nccl-version-mismatch", "torch-store-clients-missing",
            "torch-store-client-timeout", "oom-at-load-vllm", "oom-cuda-graph", "kv-cache-too-small-vllm",
            "http-port-in-use", "arch-unknown-vllm", "tokenizer-missing", "chat-template-missing",
            "trust-remote-code", "tp-not-dividing-heads", "quant-capability", "mxfp4-no-backend",
            "dev-shm-too-small", "driver-too-old", "worker-killed-sigkill", "host-oom-killer",
            "ray-placement-timeout", "ray-duplicate-node-ip", "hccl-init-failed", "safetensors-corrupt",
            "shard-file-missing", "fd-limit")
SIGS = signatures()


def test_catalog_is_large_and_covers_the_issue() -> None:
    ids = {s.id for s in SIGS}
    assert len(SIGS) >= 40
    assert set(REQUIRED) <= ids, set(REQUIRED) - ids


@pytest.mark.parametrize("sig", SIGS, ids=[s.id for s in SIGS])
def test_each_signature_names_its_own_line_and_no_other(sig) -> None:  # type: ignore[no-untyped-def]
    named = name_line(sig.example, sig.example_context)
    assert named is not None and named[0].id == sig.id, named and named[0].id
    found = explain("\n".join((*sig.example_context, sig.example)))
    assert [f.signature.id for f in found] == [sig.id]
    assert found[0].line_numbers == (len(sig.example_context) + 1,)


@pytest.mark.parametrize("sig", SIGS, ids=[s.id for s in SIGS])
def test_each_signature_is_complete(sig) -> None:  # type: ignore[no-untyped-def]
    assert sig.cause.endswith(".") and sig.fix.endswith(".") and sig.engines and sig.versions
    assert re.search(r"\w+/\S+(:\d+)?|tests/assets/failures|Linux|errno|EI\d+", sig.source), sig.source
    groups = {g for p in sig.patterns for g in p.groupindex}
    for text in (sig.cause, sig.fix):
        names = {n for _, n, _, _ in string.Formatter().parse(text) if n}
        assert names <= groups | set(FACTS) | set(DERIVED), names - groups - set(FACTS) - set(DERIVED)


def test_fixes_are_filled_from_the_line_and_the_node() -> None:
    log = ("INFO starting\n(APIServer pid=31) ValueError: Total number of attention heads (64) must be divisible by "
           "tensor parallel size (6).\n")
    (f,) = explain(log)
    assert f.line_numbers == (2,)
    assert "parallel.tp to a divisor of 64 (1, 2, 4, 8, 16, 32, 64)" in f.fix
    (g,) = explain("[E socket.cpp:922] Unable to find address for: ens-bogus", {"rank": "1", "ip": "10.0.0.11",
                                                                              "host": "node-1"})
    assert "nodes[1].iface" in g.fix and "10.0.0.11 on node-1" in g.fix
    assert fill("set {x} to {y}", {"x": "a"}) == "set a to <y>"


def test_a_signature_with_a_context_holds_only_after_it() -> None:
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB."
    assert [f.signature.id for f in explain(oom)] == ["oom-gpu"]
    log = f"Capturing CUDA graphs (decode, FULL): 10%\n{oom}\n"
    assert [f.signature.id for f in explain(log)] == ["oom-cuda-graph"]


def test_every_line_is_counted_and_stack_frames_never_name_a_cause() -> None:
    line = "OSError: [Errno 24] Too many open files"
    (f,) = explain(f"{line}\nok\n{line}\n")
    assert f.line_numbers == (1, 3)
    frame = ("frame #2: c10::DistNetworkError::DistNetworkError(c10::SourceLocation, std::string) + 0x72 "
             "(0x7fad08b7b022 in /usr/lib/torch/lib/libc10.so)")
    assert explain(frame) == []


def test_first_fatal_skips_lines_an_engine_exits_after() -> None:
    log = ("OSError: [Errno 98] Address already in use\n"
           "torch.distributed.DistStoreError: Timed out after 601 seconds waiting for clients. 3/4 clients joined.\n")
    f = first_fatal(log)
    assert f is not None and f.signature.id == "torch-store-clients-missing"
    assert "only 3 of 4 joined" in f.cause
    assert first_fatal("OSError: [Errno 98] Address already in use") is None
