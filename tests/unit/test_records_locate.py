"""NAME or FILE, one resolver: a topology file names its deployment and state directory; a name is looked up."""
from __future__ import annotations

from pathlib import Path

import pytest

from k3deploy.errors import InputError
from k3deploy.records.files import default_state_dir
from k3deploy.records.locate import locate

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "topologies" / "local-demo.yaml"


def test_a_topology_file_gives_its_name_topology_and_the_state_dir_asked_for(tmp_path: Path) -> None:
    found = locate(str(DEMO), str(tmp_path))
    assert found.topology is not None and found.name == found.topology.name
    assert (found.file, found.store.directory) == (DEMO, tmp_path)


def test_a_name_is_looked_up_in_the_default_state_dir() -> None:
    found = locate("demo-name", None)
    assert (found.name, found.file, found.topology, found.store.directory) == ("demo-name", None, None,
                                                                              default_state_dir())


def test_an_invalid_topology_file_is_an_input_error_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(InputError, match=f"{bad} is not a valid topology"):
        locate(str(bad), None)


def test_a_missing_topology_file_is_an_input_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read"):
        locate(str(tmp_path / "gone.yaml"), None)


def test_a_path_the_system_cannot_stat_is_an_input_error_not_a_traceback(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read"):  # is_file() raises for this one (ENAMETOOLONG)
        locate(str(tmp_path / ("x" * 5000)), None)
