"""deploy/keda/workers.yaml (docs/operations.md, "Autoscaling workers"): the
manifests parse, the ScaledObject scales the Deployment, and its PromQL query
gives the backlog KEDA should see, evaluated by Prometheus's own promtool on
series as two server nodes export them: ready plus running work counted once
(not once per node), scheduled work and other queues left out, 0 while the
queue is paused or has no open work."""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import REPO_ROOT, Skip, run_tests  # noqa: E402

MANIFEST = REPO_ROOT / "deploy" / "keda" / "workers.yaml"


def manifests():
    try:
        import yaml
    except ImportError:
        raise Skip("python3-yaml is not installed") from None
    return list(yaml.safe_load_all(MANIFEST.read_text())), yaml


def test_manifests_parse_and_point_at_each_other():
    docs, _ = manifests()
    kinds = [d["kind"] for d in docs]
    assert kinds == ["Deployment", "ScaledObject"], kinds
    deployment, scaled = docs
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    trigger = scaled["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus", trigger
    assert "workd_queue_depth" in trigger["metadata"]["query"], trigger
    pod = deployment["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > 35, \
        "the pod must outlive the worker's --grace (30 s) and --kill-grace (5 s)"


def test_query_counts_the_backlog_once():
    exe = shutil.which("promtool") or str(REPO_ROOT / "tools" / "promtool" / "promtool")
    if not Path(exe).exists():
        raise Skip("promtool not found (scripts/install-promtool makes tools/promtool/promtool)")
    docs, yaml = manifests()
    query = docs[1]["spec"]["triggers"][0]["metadata"]["query"]

    def series(name, labels, values):
        return {"series": f"{name}{{{labels}}}", "values": values}
    inputs = []
    for node in ("a", "b"):  # every node exports the same depths
        inputs += [
            series("workd_queue_depth", f'instance="{node}",queue="default",state="pending"',
                   "6 6 6 0"),
            series("workd_queue_depth", f'instance="{node}",queue="default",state="running"',
                   "3 3 3 0"),
            series("workd_queue_depth", f'instance="{node}",queue="default",state="scheduled"',
                   "50 50 50 50"),
            series("workd_queue_depth", f'instance="{node}",queue="other",state="pending"',
                   "70 70 70 70"),
            series("workd_queue_paused", f'instance="{node}",queue="default"', "0 1 0 0"),
        ]
    # minutes 0 and 2: 6 ready + 3 running; 1: paused; 3: nothing open.
    expected = [9, 0, 9, 0]
    with tempfile.TemporaryDirectory() as tmp:
        rules = Path(tmp) / "rules.yml"
        rules.write_text(yaml.safe_dump(
            {"groups": [{"name": "keda", "rules": [{"record": "workd:backlog", "expr": query}]}]}))
        test = Path(tmp) / "test.yml"
        test.write_text(yaml.safe_dump({
            "rule_files": [str(rules)], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": inputs, "promql_expr_test": [
                {"expr": "workd:backlog", "eval_time": f"{m}m",
                 "exp_samples": [{"labels": "workd:backlog", "value": v}]}
                for m, v in enumerate(expected)]}]}))
        r = subprocess.run([exe, "test", "rules", str(test)], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, f"promtool test rules:\n{r.stdout}{r.stderr}"


if __name__ == "__main__":
    run_tests(globals())
