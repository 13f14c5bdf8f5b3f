"""The executor contract (tests/executor_contract.py) against the local executor."""
from __future__ import annotations

from pathlib import Path

import pytest

from k3deploy.executors.target import LocalTarget
from tests.contract_node import ContractNode, http_server
from tests.executor_contract import *  # the shared behaviour tests


@pytest.fixture
def node(tmp_path: Path) -> ContractNode:
    return ContractNode(kind="local", target=LocalTarget(host="nodeL"), scratch=tmp_path,
                        serve_http=lambda ip, port: http_server(ip, port, "nodeL"), node_ip="127.0.0.1")
