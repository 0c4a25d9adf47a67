#!/usr/bin/env python3
"""Drives the real Helm engine (Helm v4's Go library, bundled by the helm-sdkpy wheel)
for tests/helm.rs: lint the chart, or install / upgrade it into a kube-sim API server.

    helm.py lint CHART
    helm.py install CHART --kubeconfig K --namespace N --release R [--values JSON] [--upgrade-values JSON]

Prints one JSON object on stdout: {"lint": …} or {"manifest": …, "upgrade_manifest": …}.
Exits 1 with Helm's own error message on stderr when Helm refuses (bad values, a
template error, an API error). Release records are kept in memory (HELM_DRIVER=memory):
kube-sim does not speak protobuf, which Helm's Secret storage driver uses.
"""
import argparse
import asyncio
import json
import os
import sys

if os.environ.get("HELM_DRIVER") != "memory":
    # Go reads the environment once, when the library loads: set it for a fresh process.
    os.execvpe(sys.executable, [sys.executable, *sys.argv], {**os.environ, "HELM_DRIVER": "memory"})

import helm_sdkpy as helm  # noqa: E402  (HELM_DRIVER must be set first)

SEVERITY = {0: "unknown", 1: "info", 2: "warning", 3: "error"}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["lint", "install"])
    parser.add_argument("chart")
    parser.add_argument("--kubeconfig")
    parser.add_argument("--namespace", default="gpu-reaper")
    parser.add_argument("--release", default="gpu-reaper")
    parser.add_argument("--values", default="{}")
    parser.add_argument("--upgrade-values")
    args = parser.parse_args()
    try:
        if args.command == "lint":
            config = helm.Configuration(namespace=args.namespace)
            result = asyncio.run(helm.Lint(config).run(args.chart))
            messages = [
                {"severity": SEVERITY.get(m.get("Severity"), "unknown"), "path": m.get("Path")}
                for m in result.get("Messages") or []
            ]
            print(json.dumps({"lint": {"messages": messages, "errors": result.get("Errors")}}))
            return 0
        config = helm.Configuration(namespace=args.namespace, kubeconfig=args.kubeconfig)
        installed = asyncio.run(
            helm.Install(config).run(
                args.release,
                args.chart,
                values=json.loads(args.values),
                create_namespace=True,
                wait=False,
                timeout=60,
            )
        )
        out = {"manifest": installed.get("manifest", "")}
        if args.upgrade_values is not None:
            upgraded = asyncio.run(
                helm.Upgrade(config).run(
                    args.release,
                    args.chart,
                    values=json.loads(args.upgrade_values),
                    wait=False,
                    timeout=60,
                )
            )
            out["upgrade_manifest"] = upgraded.get("manifest", "")
        print(json.dumps(out))
        return 0
    except helm.HelmError as e:
        print(f"helm: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
