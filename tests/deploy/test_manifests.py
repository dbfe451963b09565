"""deploy/ and docker/: every manifest loads into the kubernetes client's models with no unknown key,
the container commands parse with gpuheal's own CLI, and the policy ConfigMap is a valid policy
(the controller's RBAC: test_rbac.py)."""

import json
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from api.episode import SEARCH_ATTRIBUTES
from policies.loader import policy_from_mapping
from workers.cli_parser import build_parser

ROOT = Path(__file__).resolve().parents[2]
MODELS = {"Namespace": "V1Namespace", "ServiceAccount": "V1ServiceAccount", "ClusterRole": "V1ClusterRole",
          "ClusterRoleBinding": "V1ClusterRoleBinding", "ConfigMap": "V1ConfigMap", "Deployment": "V1Deployment",
          "DaemonSet": "V1DaemonSet", "NetworkPolicy": "V1NetworkPolicy"}


def manifests() -> list[dict]:
    docs = []
    for f in sorted((ROOT / "deploy").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(f.read_text()) if d]
    return docs


def _prune(x):
    if isinstance(x, dict):
        return {k: _prune(v) for k, v in x.items() if v not in (None, {}, [])}
    if isinstance(x, list):
        return [_prune(v) for v in x]
    return x


@pytest.mark.parametrize("doc", manifests(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_manifest_is_a_valid_object_with_no_unknown_key(doc):
    api = client.ApiClient()
    model = api._ApiClient__deserialize(doc, MODELS[doc["kind"]])  # the client's own model classes
    # A misspelt key is dropped by the model: what comes back out must be what went in.
    assert _prune(api.sanitize_for_serialization(model)) == _prune(json.loads(json.dumps(doc)))


def _workload(kind: str) -> tuple[dict, dict]:
    """A workload's pod template and its container's environment (ConfigMap envFrom, then env)."""
    docs = manifests()
    configmaps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    tmpl = next(d for d in docs if d["kind"] == kind)["spec"]["template"]
    ctr = tmpl["spec"]["containers"][0]
    env = {}
    for src in ctr.get("envFrom", []):
        env.update(configmaps[src["configMapRef"]["name"]])
    env.update({e["name"]: e.get("value") for e in ctr.get("env", [])})
    return tmpl, env


@pytest.mark.parametrize("kind", ["Deployment", "DaemonSet"])
def test_temporal_is_reached_with_mutual_tls_from_a_secret_of_its_own(kind):
    tmpl, env = _workload(kind)
    ctr, volumes = tmpl["spec"]["containers"][0], {v["name"]: v for v in tmpl["spec"]["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in ctr["volumeMounts"]}
    for key in ("TEMPORAL_TLS_CLIENT_CERT_PATH", "TEMPORAL_TLS_CLIENT_KEY_PATH", "TEMPORAL_TLS_SERVER_CA_CERT_PATH"):
        path = Path(env[key])
        assert str(path.parent) in mounts, f"{kind}: {key} {path} is on no mounted volume"
        assert "secret" in mounts[str(path.parent)], f"{kind}: {key} must come from a Secret"
    secret = mounts[str(Path(env["TEMPORAL_TLS_CLIENT_CERT_PATH"]).parent)]["secret"]["secretName"]
    other = "DaemonSet" if kind == "Deployment" else "Deployment"
    tmpl2, env2 = _workload(other)
    vols2 = {v["name"]: v for v in tmpl2["spec"]["volumes"]}
    secrets2 = {v["secret"]["secretName"] for v in vols2.values() if "secret" in v}
    assert secret not in secrets2, "the controller and the agents hold different client certificates"


def _selects(selector: dict, labels: dict) -> bool:
    """A label selector as the API server evaluates it (matchLabels AND matchExpressions)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        has, value = e["key"] in labels, labels.get(e["key"])
        ok = {"In": has and value in e.get("values", []), "NotIn": not has or value not in e.get("values", []),
              "Exists": has, "DoesNotExist": not has}[e["operator"]]
        if not ok:
            return False
    return True


def _admitted(policy: dict, namespace: str, ns_labels: dict, pod_labels: dict, port: int) -> bool:
    """Whether one NetworkPolicy's ingress rules admit a pod's connection (peers in a rule are ORed;
    a namespaceSelector and podSelector in one peer are ANDed; no podSelector/namespaceSelector:
    the policy's own namespace)."""
    for rule in policy["spec"].get("ingress", []):
        if rule.get("ports") and not any(p.get("port") == port for p in rule["ports"]):
            continue
        for peer in rule.get("from", [{}]):
            if "namespaceSelector" in peer:
                ns_ok = _selects(peer["namespaceSelector"], ns_labels)
            else:
                ns_ok = namespace == policy["metadata"]["namespace"]
            if ns_ok and _selects(peer.get("podSelector", {}), pod_labels):
                return True
    return False


def test_only_the_controller_and_agents_reach_the_temporal_frontend():
    pol = next(d for d in manifests() if d["kind"] == "NetworkPolicy" and d["metadata"]["namespace"] == "temporal")
    frontend = {"app.kubernetes.io/name": "temporal", "app.kubernetes.io/component": "frontend"}
    assert _selects(pol["spec"]["podSelector"], frontend), "the policy selects the frontend pods"
    gpuheal_ns = {"kubernetes.io/metadata.name": "gpuheal"}
    for kind in ("Deployment", "DaemonSet"):
        labels = _workload(kind)[0]["metadata"]["labels"]
        assert _admitted(pol, "gpuheal", gpuheal_ns, labels, 7233), f"{kind} must reach the frontend"
    tenant = {"app": "train", "app.kubernetes.io/name": "gpuheal-agent"}  # a tenant copying our labels
    assert not _admitted(pol, "ml", {"kubernetes.io/metadata.name": "ml"}, tenant, 7233)
    assert not _admitted(pol, "gpuheal", gpuheal_ns, {"app": "debug"}, 7233)
    assert _admitted(pol, "temporal", {"kubernetes.io/metadata.name": "temporal"}, {"app.kubernetes.io/component": "history"}, 7233)


def test_containers_run_commands_gpuheal_accepts():
    pods = [d["spec"]["template"]["spec"] for d in manifests() if d["kind"] in ("Deployment", "DaemonSet")]
    assert len(pods) == 2
    for spec in pods:
        for ctr in spec["containers"]:
            args = [a.replace("$(NODE_NAME)", "gpu-node-0") for a in ctr["args"]]
            build_parser().parse_args(args)  # exits (SystemExit) on a flag gpuheal does not have


def test_policy_configmap_is_a_valid_policy():
    cm = next(d for d in manifests() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpuheal-policy")
    policy = policy_from_mapping(yaml.safe_load(cm["data"]["policy.yaml"]))
    assert policy.ladder.replace.requires_approval


def test_agent_tolerates_quarantine_and_has_no_api_token():
    ds = next(d for d in manifests() if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    assert {"operator": "Exists"} in ds["tolerations"], "the agent must stay on the nodes gpuheal quarantines"
    assert ds["automountServiceAccountToken"] is False and ds["hostPID"] is True


# --- docker ---------------------------------------------------------------------------------------
def test_dockerfile_copies_paths_that_exist():
    text = (ROOT / "docker/Dockerfile").read_text()
    sources = [line.split()[1] for line in text.splitlines() if line.startswith("COPY ") and "--from" not in line]
    assert sources and all((ROOT / s).exists() for s in sources), sources
    assert "USER 10001" in text


def test_compose_parses_and_runs_real_commands():
    doc = yaml.safe_load((ROOT / "docker/compose.yaml").read_text())
    assert {"temporal", "controller", "fleet"} <= set(doc["services"])
    for name, svc in doc["services"].items():
        if "build" in svc:
            ctx = (ROOT / "docker" / svc["build"]["context"]).resolve()
            assert (ctx / svc["build"]["dockerfile"]).exists(), name
            build_parser().parse_args(svc["command"])
    cmd = doc["services"]["temporal"]["command"]
    flags = {cmd[i + 1] for i, a in enumerate(cmd) if a == "--search-attribute"}
    kinds = {"KEYWORD": "Keyword", "KEYWORD_LIST": "KeywordList"}
    assert flags == {f"{k.name}={kinds[k.indexed_value_type.name]}" for k in SEARCH_ATTRIBUTES}


def test_iam_policy_conditions_each_action_on_the_resource_aws_evaluates():
    """TerminateInstanceInAutoScalingGroup is authorized against the Auto Scaling *group* (resource
    type autoScalingGroup, condition key autoscaling:ResourceTag/...), not the instance: the
    group must carry the ownership tag (propagated to its instances, which the code checks before
    it acts). EC2 actions are authorized against the instance (aws:ResourceTag/...)."""
    policy = json.loads((ROOT / "deploy" / "iam-policy.json").read_text())
    by_action = {a: st for st in policy["Statement"] for a in st["Action"]}
    asg = by_action["autoscaling:TerminateInstanceInAutoScalingGroup"]
    assert asg["Resource"].startswith("arn:aws:autoscaling:") and ":autoScalingGroup:" in asg["Resource"]
    assert asg["Condition"] == {"StringEquals": {"autoscaling:ResourceTag/gpuheal.io/managed": "true"}}
    for action in ("ec2:RebootInstances", "ec2:TerminateInstances", "ec2:CreateTags"):
        st = by_action[action]
        assert st["Resource"] == "arn:aws:ec2:*:*:instance/*"
        assert st["Condition"] == {"StringEquals": {"aws:ResourceTag/gpuheal.io/managed": "true"}}
