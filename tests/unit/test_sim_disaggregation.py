"""The stand-in's PD pieces: the roles SGLang's flags give, the router's bootstrap fields, and what a
decode's KDA state holds after a transfer that was intact, zeroed, dropped or for other tokens."""

from __future__ import annotations

import pytest

from k3deploy.sim.disaggregation import Bootstrap, bootstrap_of, prefilled_state, received_facts
from k3deploy.sim.engine_args import parse_engine_args
from k3deploy.sim.faults import Faults
from k3deploy.sim.recall import read_facts
from k3deploy.sim.serve_config import ServeConfig, resolve_config

pytestmark = pytest.mark.timeout(30)
BASE = "--mimic sglang /models/k3 --disaggregation-transfer-backend nixl --disaggregation-bootstrap-port 9100"


def sglang(extra: str) -> ServeConfig:
    return resolve_config("sglang", parse_engine_args("sglang", f"{BASE} {extra}".split()), {})


def test_roles_from_the_real_flags() -> None:
    prefill = sglang("--disaggregation-mode prefill")
    assert (prefill.pd_mode, prefill.bootstrap_port, prefill.prefix_cache) == ("prefill", 9100, True)
    # SGLang forces a decode server's KV cache to a chunk cache unless its radix cache is asked for.
    assert sglang("--disaggregation-mode decode").prefix_cache is False
    assert sglang("--disaggregation-mode decode --disaggregation-decode-enable-radix-cache").prefix_cache is True
    assert sglang("").pd_mode is None and sglang("--disaggregation-mode null").pd_mode is None


def test_bootstrap_fields_as_the_router_injects_them() -> None:
    body = {"messages": [], "bootstrap_host": "10.0.0.1", "bootstrap_port": 9100, "bootstrap_room": 2**62}
    assert bootstrap_of(body, 8998) == Bootstrap("10.0.0.1", 9100, 2**62)
    # smg sends null for a prefill given without a port: the engine's default applies.
    assert bootstrap_of({**body, "bootstrap_port": None}, 8998) == Bootstrap("10.0.0.1", 8998, 2**62)
    assert bootstrap_of({"messages": []}, 8998) is None


TEXT = "The code of room-1 is AB1-22. filler words here The code of room-2 is CD3-44. What is the code of room-1?"
ASKED = "What is the code of room-1?"
IDS = list(range(40))


@pytest.mark.parametrize(
    ("faults", "held"),
    [(Faults(), {"code of room-1", "code of room-2"}), (Faults({"transfer_kda_zeroed": None}), set()),
     (Faults({"transfer_kda_dropped": None}), set())],
)
def test_what_the_decode_state_holds(faults: Faults, held: set[str]) -> None:
    facts = read_facts(TEXT, ASKED)
    state = prefilled_state(IDS, facts, 0, faults)
    assert set(received_facts(state, IDS, 0)) == held


def test_a_state_for_other_tokens_or_another_skip_holds_nothing() -> None:
    facts = read_facts(TEXT, ASKED)
    state = prefilled_state(IDS, facts, 0, Faults())
    assert received_facts(state, [*IDS[:-1], 999], 0) == {}
    assert received_facts(state, IDS, 8) == {}
    # Past the decode's cached prefix only the MLA KV past it travels; the KDA state is the one after the whole
    # prompt (a recurrent state), so it holds every fact, a fact before the cached prefix too.
    skip = facts["code of room-2"][1]
    later = prefilled_state(IDS, facts, skip, Faults())
    assert later["token_ids"] == IDS[skip:]
    assert set(received_facts(later, IDS, skip)) == {"code of room-1", "code of room-2"}
    zeroed = prefilled_state(IDS, facts, skip, Faults({"transfer_kda_zeroed": None}))
    assert received_facts(zeroed, IDS, skip) == {}  # a hit on the decode cannot restore what the transfer lost
