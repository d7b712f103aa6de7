"""The deployment files (issue 19): the image runs unprivileged, and compose.yaml exposes
nothing, metrics included, beyond its internal network."""

from __future__ import annotations

from tests.support import ROOT


def test_the_image_runs_as_an_unprivileged_user_owning_the_data_dir() -> None:
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    users = [line.split()[1].split(":")[0] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0"), "the last USER runs the service"
    assert any("chown" in line and "/data" in line for line in lines), "the data dir is that user's"


def test_compose_keeps_every_service_and_the_metrics_on_an_internal_network() -> None:
    import yaml

    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    internal = {name for name, network in compose.get("networks", {}).items() if (network or {}).get("internal")}
    for name, service in compose["services"].items():
        assert "ports" not in service, f"{name} publishes a port on the host"
        networks = set(service.get("networks", []))
        # Metrics on 0.0.0.0 are safe only where every network the container joins is internal.
        assert networks and networks <= internal, f"{name} joins a network that is not internal: {networks}"
