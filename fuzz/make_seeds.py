#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets from real data (run from the repository
root; ../shared/fixtures must exist): fuzz/corpus/{prometheus_answer,trace,policy,admit,object}/.
The corpora are derived data of public files: not committed, written by scripts/test
before the tests (tests/pure/fuzz_inputs.rs reads them).

Every seed is a real file, an exact slice of one, or a derivation named in its file
name (`+ts`: the DCGM scrape with a timestamp appended to each sample line; `matrix`:
an instant-vector answer rewritten as a range vector; `om`: MIGProfiler CSV rows written
as OpenMetrics). Small files only: the corpora stay well under 1 MB.

    python3 fuzz/make_seeds.py [FIXTURES_DIR]
"""
import glob
import gzip
import json
import os
import re
import sys

FIXTURES = sys.argv[1] if len(sys.argv) > 1 else "../shared/fixtures"
OUT = "fuzz/corpus"


def write(target, name, data):
    os.makedirs(f"{OUT}/{target}", exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(f"{OUT}/{target}/{name}", "wb") as f:
        f.write(data)


def first_lines(text, max_bytes):
    """The longest prefix of whole lines within max_bytes."""
    cut = text[:max_bytes]
    return cut[: cut.rfind("\n") + 1] if "\n" in cut else cut


# --- Prometheus /api/v1/query answers -------------------------------------------------
for path in sorted(glob.glob(f"{FIXTURES}/dcgm/*prometheus-api-v1-query*.json")):
    base = os.path.basename(path)
    raw = open(path, "rb").read()
    write("prometheus_answer", base, raw)
    answer = json.loads(raw)
    # The same series as a range vector (what fetch_trace reads), three samples each.
    matrix = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {
                    "metric": r["metric"],
                    "values": [[r["value"][0] - 60 * k, r["value"][1]] for k in (2, 1, 0)],
                }
                for r in answer["data"]["result"][:4]
            ],
        },
    }
    write("prometheus_answer", base.replace(".json", ".matrix.json"), json.dumps(matrix))
write(
    "prometheus_answer",
    "error-answer.json",
    '{"status":"error","errorType":"bad_data","error":"invalid parameter \\"query\\""}',
)

# --- OpenMetrics traces -----------------------------------------------------------------
for path in sorted(glob.glob(f"{FIXTURES}/dcgm/*.prom")):
    base = os.path.basename(path)
    text = open(path).read()
    write("trace", base, first_lines(text, 4096))
    stamped = "".join(
        line if line.startswith("#") or not line.strip() else line.rstrip("\n") + " 1793577600\n"
        for line in text.splitlines(keepends=True)
    )
    write("trace", base.replace(".prom", "+ts.prom"), first_lines(stamped, 4096))

sample = gzip.open("config/samples/trace.om.gz", "rt").read()
write("trace", "sample-trace-first-1k.om", first_lines(sample, 1024))
# Two lines of every family of the bundled trace, so each kube-state-metrics branch has a seed.
families = {}
for line in sample.splitlines(keepends=True):
    if line.startswith("#"):
        continue
    name = re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group(0)
    families.setdefault(name, [])
    if len(families[name]) < 2:
        families[name].append(line)
for name, lines in sorted(families.items()):
    write("trace", f"sample-trace-{name}.om", "".join(lines))

for path in sorted(glob.glob(f"{FIXTURES}/traces/*.csv")):
    base = os.path.basename(path)
    text = open(path).read()
    write("trace", base.replace(".csv", ".head.csv"), first_lines(text, 512))
    rows = [r.split(",") for r in text.splitlines()[1:9]]
    om = "".join(
        f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu="{r[0]}",UUID="GPU-migprofiler-{r[0]}",'
        f'modelName="NVIDIA A100-SXM4-40GB",namespace="bench",pod="{base[:40].lower().replace("_", "-")}"}} {r[1]} {r[3]}\n'
        for r in rows
        if len(r) >= 4
    )
    write("trace", base.replace(".csv", ".om"), om)

# --- GpuPolicy documents ----------------------------------------------------------------
write("policy", "config-samples-policy.yaml", open("config/samples/policy.yaml").read())
for path in sorted(glob.glob("docs/*.md")):
    text = open(path).read()
    for i, block in enumerate(text.split("```yaml\n")[1:]):
        raw = block.split("```")[0]
        indent = len(raw) - len(raw.lstrip(" "))
        body = "\n".join(line[min(indent, len(line) - len(line.lstrip(" "))):] for line in raw.splitlines())
        if "kind: GpuPolicy\n" in body:
            write("policy", f"{os.path.basename(path)[:-3]}-{i + 1}.yaml", body + "\n")
# The chart's sample policy (templates/sample-policy.yaml) rendered by hand with the
# values.yaml defaults and release namespace gpu-reaper.
write(
    "policy",
    "helm-sample-policy.yaml",
    """apiVersion: gpureaper.io/v1alpha1
kind: GpuPolicy
metadata:
  name: default-audit
  labels:
    app.kubernetes.io/name: gpu-reaper
spec:
  mode: Audit
  priority: -100
  match:
    namespaceSelector:
      matchExpressions:
      - key: kubernetes.io/metadata.name
        operator: NotIn
        values: ["kube-system","kube-node-lease","gpu-reaper"]
  idle:
    startupGrace: 20m
    window: 30m
  warn:
    after: 30m
  action:
    after: 2h
    maxPerHour: 20
    type: ScaleToZero
  cost:
    defaultHourlyUsd: 2.5
""",
)
# The same policy as JSON (parse_resource reads JSON too).
write(
    "policy",
    "json-policy.json",
    json.dumps(
        {
            "apiVersion": "gpureaper.io/v1alpha1",
            "kind": "GpuPolicy",
            "metadata": {"name": "j"},
            "spec": {"mode": "Enforce", "idle": {"window": "30m"}, "warn": {"after": "30m"},
                     "action": {"type": "Suspend", "after": "1h"}},
        }
    ),
)

# admit: the real AdmissionReviews, and a GPU variant of each (the first container of
# every pod spec found gets `nvidia.com/gpu: 16`); `request`-only captures are wrapped in
# an AdmissionReview.
def gpu_variant(value):
    if isinstance(value, dict):
        containers = value.get("containers")
        if isinstance(containers, list) and containers and isinstance(containers[0], dict):
            resources = containers[0].setdefault("resources", {})
            if isinstance(resources, dict):
                resources.setdefault("limits", {})["nvidia.com/gpu"] = "16"
        for v in value.values():
            gpu_variant(v)
    elif isinstance(value, list):
        for v in value:
            gpu_variant(v)


for path in sorted(glob.glob(f"{FIXTURES}/admission/*.json")):
    name = os.path.basename(path)
    with open(path, "rb") as f:
        raw = f.read()
    write("admit", name, raw)
    try:
        review = json.loads(raw)
    except ValueError:
        continue
    if "request" not in review:
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": review}
    gpu_variant(review.get("request", {}).get("object"))
    write("admit", f"gpu-{name}", json.dumps(review, indent=1))


# object: what the controller's watches hand over, one object as JSON — the real objects
# (`request.object`, `request.oldObject`) of ../shared/fixtures/admission, the same with
# gpu-reaper's records on them (`+records`: the warning's delivery record with its Event
# channel, a restore record, the ladder's timestamps, as this version writes them), the
# JSON policy, a policy written under a newer CRD (`action.type: Hibernate`), and an
# attestation.
RECORDS = {
    "gpureaper.io/warned-at": "2026-12-04T16:54:41Z",
    "gpureaper.io/notified": json.dumps(
        {
            "for": "2026-12-04T16:54:41Z",
            "email": {"state": "failed", "attempts": 2, "next": "2026-12-04T16:57:41Z", "detail": "450 busy"},
            "event": {"state": "sent", "attempts": 1, "detail": "Event on ml/Deployment/chat",
                      "at": "2026-12-04T16:54:41Z", "note": "Idle GPUs: … scaled to zero at 16:55:41"},
        }
    ),
    "gpureaper.io/restore": json.dumps({"replicas": 1, "state": "done"}),
    "gpureaper.io/reaped-at": "2026-12-04T16:55:41Z",
    "gpureaper.io/snooze-until": "2026-12-04T20:55:41Z",
}
for path in sorted(glob.glob(f"{FIXTURES}/admission/*.json")):
    name = os.path.basename(path)[:-5]
    try:
        review = json.load(open(path))
    except ValueError:
        continue
    request = review.get("request", review)
    for part in ("object", "oldObject"):
        obj = request.get(part) if isinstance(request, dict) else None
        if not isinstance(obj, dict) or "apiVersion" not in obj:
            continue
        write("object", f"{name}.{part}.json", json.dumps(obj, indent=1))
        marked = json.loads(json.dumps(obj))
        meta = marked.setdefault("metadata", {})
        if isinstance(meta, dict):
            annotations = meta.get("annotations")
            meta["annotations"] = dict(annotations or {}, **RECORDS) if isinstance(annotations, dict) else dict(RECORDS)
            write("object", f"{name}.{part}+records.json", json.dumps(marked, indent=1))
policy = {
    "apiVersion": "gpureaper.io/v1alpha1",
    "kind": "GpuPolicy",
    "metadata": {"name": "j", "uid": "0b1c", "generation": 3},
    "spec": {"mode": "Enforce", "priority": 10,
             "match": {"namespaceSelector": {"matchLabels": {"team": "a"}}},
             "idle": {"window": "30m"}, "warn": {"after": "30m", "channels": ["Event", "Email"]},
             "action": {"type": "ScaleToZero", "after": "1h"}},
}
write("object", "policy.json", json.dumps(policy))
newer = json.loads(json.dumps(policy))
newer["spec"]["action"]["type"] = "Hibernate"
write("object", "policy-newer-enum.json", json.dumps(newer))
write(
    "object",
    "attestation.json",
    json.dumps(
        {
            "apiVersion": "gpureaper.io/v1alpha1",
            "kind": "ReadinessAttestation",
            "metadata": {"name": "train", "namespace": "team-a", "uid": "a1"},
            "spec": {"selector": {"matchLabels": {"app": "train"}}, "maxGpus": 16,
                     "expiresAt": "2026-12-31T00:00:00Z", "owner": {"email": "ana@example.com"},
                     "evidence": {"datasetUri": "s3://bucket/train", "checkpointing": True}},
        }
    ),
)
