"""The Kubernetes manifests in deploy/kubernetes, checked offline: every core object against the
Kubernetes API schemas (PyPI's `kubernetes-validate`, strict: unknown fields are errors), and the
pieces against each other and against weft: readiness on /ready, a grace period that covers the
preStop sleep and the drain, the InferencePool selecting the weft pods on weft's port, its
endpoint picker reading metric names that weft's /metrics has.

The extension's own kinds (InferencePool, Gateway, HTTPRoute) have no schema in
kubernetes-validate; their fields are checked here by hand.
"""

from pathlib import Path

import kubernetes_validate
import yaml

from replica import ROOT, VLLM_NAMES

DEPLOY = ROOT / "deploy" / "kubernetes"
# The oldest Kubernetes still supported upstream when this was written, and the newest known.
VERSIONS = ["1.32.0", kubernetes_validate.utils.latest_version()]
CUSTOM_KINDS = {"InferencePool", "Gateway", "HTTPRoute"}


def objects():
    found = {}
    for path in sorted(DEPLOY.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                found[(doc["kind"], doc["metadata"]["name"])] = doc
    return found


def args_of(container):
    """`--flag value` and `--flag=value` arguments as a dict."""
    args, out = container.get("args", []), {}
    i = 0
    while i < len(args):
        key, eq, val = args[i].partition("=")
        if eq:
            out[key] = val
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[key] = args[i + 1]
            i += 1
        else:
            out[key] = ""
        i += 1
    return out


def test_core_objects_validate_against_the_kubernetes_schemas():
    core = [o for (kind, _), o in objects().items() if kind not in CUSTOM_KINDS]
    assert {o["kind"] for o in core} >= {"Deployment", "Service", "ConfigMap", "ServiceAccount", "Role", "RoleBinding", "Namespace"}
    for version in VERSIONS:
        for o in core:
            kubernetes_validate.validate(o, version, strict=True)


def test_kustomization_lists_every_manifest():
    k = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert sorted(k["resources"]) == sorted(p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")
    assert {i["name"] for i in k["images"]} == {"weft", "epp"}


def test_deployment_probes_and_shutdown_fit_weft():
    o = objects()
    pod = o[("Deployment", "weft")]["spec"]["template"]
    c = pod["spec"]["containers"][0]
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    # The grace period covers the preStop sleep and the whole drain.
    sleep = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    drain = float(args_of(c)["--drain-timeout"])
    assert pod["spec"]["terminationGracePeriodSeconds"] >= sleep + drain + 5
    port = c["ports"][0]["containerPort"]
    svc = o[("Service", "weft")]["spec"]
    assert svc["selector"] == pod["metadata"]["labels"]
    assert svc["ports"][0]["targetPort"] == c["ports"][0]["name"]
    # The image's EXPOSE is the same port.
    assert f"EXPOSE {port}" in (ROOT / "deploy" / "container" / "Containerfile").read_text()


def test_inference_pool_points_at_weft_and_its_metrics():
    o = objects()
    weft = o[("Deployment", "weft")]["spec"]["template"]
    pool = o[("InferencePool", "weft")]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"]["selector"]["matchLabels"] == weft["metadata"]["labels"]
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [weft["spec"]["containers"][0]["ports"][0]["containerPort"]]
    # The endpoint picker: its Service and port, its pool, the metric names it reads.
    ref = pool["spec"]["endpointPickerRef"]
    epp_svc = o[("Service", ref["name"])]["spec"]
    assert ref["port"]["number"] in [p["port"] for p in epp_svc["ports"]]
    epp = o[("Deployment", ref["name"])]["spec"]["template"]
    assert epp_svc["selector"] == epp["metadata"]["labels"]
    c = epp["spec"]["containers"][0]
    args = args_of(c)
    assert args["--pool-name"] == pool["metadata"]["name"]
    assert args["--model-server-metrics-path"] == "/metrics"
    metric_flags = [k for k in args if k.endswith("-metric")]
    assert len(metric_flags) == 5, args
    for flag in metric_flags:
        assert args[flag] in VLLM_NAMES, f"{flag}={args[flag]} is not among weft's vLLM names"
    # Its plugin configuration parses and every profile names a defined plugin.
    volume = next(v for v in epp["spec"]["volumes"] if v["name"] == c["volumeMounts"][0]["name"])
    config_map = o[("ConfigMap", volume["configMap"]["name"])]
    file_name = Path(args["--config-file"]).name
    config = yaml.safe_load(config_map["data"][file_name])
    assert config["kind"] == "EndpointPickerConfig"
    defined = {p["type"] for p in config["plugins"]}
    for profile in config["schedulingProfiles"]:
        assert {p["pluginRef"] for p in profile["plugins"]} <= defined
    # The picker may run as long as the pods it routes to.
    assert epp["spec"]["terminationGracePeriodSeconds"] >= weft["spec"]["terminationGracePeriodSeconds"]
    # Its service account is bound to a role that can watch pods and pools.
    binding = o[("RoleBinding", epp["spec"]["serviceAccountName"])]
    role = o[("Role", binding["roleRef"]["name"])]
    resources = {r for rule in role["rules"] for r in rule["resources"]}
    assert {"pods", "inferencepools"} <= resources


def test_route_sends_the_api_to_the_pool():
    o = objects()
    route = o[("HTTPRoute", "weft")]
    gateway = o[("Gateway", route["spec"]["parentRefs"][0]["name"])]
    assert gateway["apiVersion"] == route["apiVersion"] == "gateway.networking.k8s.io/v1"
    backend = route["spec"]["rules"][0]["backendRefs"][0]
    assert (backend["group"], backend["kind"], backend["name"]) == ("inference.networking.k8s.io", "InferencePool", "weft")
