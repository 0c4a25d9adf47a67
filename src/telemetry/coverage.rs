//! What a history read from Prometheus holds, to say what is missing before a backtest
//! or an export silently reports "0 workloads on 0 GPUs": no DCGM series, DCGM series
//! that name no workload's pod (which labels are absent), no kube-state-metrics series,
//! or no GPU requests among them. Pure: it is fed every sample as it streams by, and
//! keeps one small hash per series, never the samples.

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};

use super::openmetrics::{RawSample, parse_labels};
use super::trace::{WorkloadLabels, gpu_identity};

/// The DCGM exporter's families gpu-reaper reads (the others of
/// [`super::trace::KNOWN_METRICS`] are kube-state-metrics').
fn is_dcgm(metric: &str) -> bool {
    metric.starts_with("DCGM_FI_")
}

/// Counts of series by what they can tell a backtest.
#[derive(Debug, Clone, Default)]
pub struct Coverage {
    workload_labels: WorkloadLabels,
    last_series: String,
    seen: HashSet<u64>,
    /// Samples observed.
    pub samples: u64,
    /// DCGM series, and of those: naming a workload's pod and namespace; without a
    /// `UUID`; without a pod label; labelled only with the exporter's own pod; with a pod
    /// but no namespace.
    pub dcgm_series: usize,
    pub dcgm_attributed: usize,
    pub dcgm_without_uuid: usize,
    pub dcgm_without_pod: usize,
    pub dcgm_exporter_pod: usize,
    pub dcgm_without_namespace: usize,
    /// One exporter pod name seen, for the message.
    pub exporter_pod: Option<String>,
    /// kube-state-metrics series, and of those: GPU requests
    /// (`kube_pod_container_resource_requests` of `nvidia_com_gpu` or `nvidia_com_mig_*`),
    /// and those whose `pod`/`namespace` Prometheus renamed `exported_*`.
    pub ksm_series: usize,
    pub ksm_gpu_requests: usize,
    pub ksm_exported_labels: usize,
}

/// What a history lacks: each entry names the series or labels and what fixes it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{source_name} between {from} and {to} lacks what gpu-reaper needs:\n  - {}", .problems.join("\n  - "))]
pub struct MissingSeries {
    /// Where the history came from (the Prometheus URL).
    pub source_name: String,
    pub from: String,
    pub to: String,
    pub problems: Vec<String>,
}

impl Coverage {
    /// Counts series whose DCGM workload labels are named by `workload_labels` (unset:
    /// detected per series, as the trace reader does).
    pub fn new(workload_labels: WorkloadLabels) -> Self {
        Self {
            workload_labels,
            ..Self::default()
        }
    }

    /// Counts `s` (its series once).
    pub fn observe(&mut self, s: &RawSample<'_>) {
        self.samples += 1;
        if self.last_series == s.series {
            return;
        }
        self.last_series.clear();
        self.last_series.push_str(s.series);
        let mut hasher = DefaultHasher::new();
        s.series.hash(&mut hasher);
        if !self.seen.insert(hasher.finish()) {
            return;
        }
        // A label set the trace reader cannot parse is its error to report, with the line.
        let labels = parse_labels(s.labels).unwrap_or_default();
        let label = |name: &str| {
            labels
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
                .filter(|v| !v.is_empty())
        };
        if is_dcgm(s.metric) {
            self.dcgm_series += 1;
            match gpu_identity(label, &self.workload_labels) {
                Err(_) => self.dcgm_without_uuid += 1,
                Ok(gpu) if gpu.pod.is_empty() => self.dcgm_without_pod += 1,
                Ok(gpu) if gpu.pod.contains("dcgm-exporter") => {
                    self.dcgm_exporter_pod += 1;
                    self.exporter_pod.get_or_insert(gpu.pod);
                }
                Ok(gpu) if gpu.namespace.is_empty() => self.dcgm_without_namespace += 1,
                Ok(_) => self.dcgm_attributed += 1,
            }
            return;
        }
        self.ksm_series += 1;
        if s.metric == "kube_pod_container_resource_requests"
            && label("resource")
                .is_some_and(|r| r == "nvidia_com_gpu" || r.starts_with("nvidia_com_mig_"))
        {
            self.ksm_gpu_requests += 1;
        }
        if label("exported_pod").is_some() || label("exported_namespace").is_some() {
            self.ksm_exported_labels += 1;
        }
    }

    /// What is missing for a backtest, or `Ok` when nothing is. `source_name`, `from` and
    /// `to` say where and when, for the message.
    pub fn check(&self, source_name: &str, from: i64, to: i64) -> Result<(), MissingSeries> {
        let mut problems = Vec::new();
        let (pod, namespace) = match &self.workload_labels.pod {
            Some(pod) => (
                format!("`{pod}`"),
                format!(
                    "`{}`",
                    self.workload_labels
                        .namespace
                        .as_deref()
                        .unwrap_or("namespace")
                ),
            ),
            None => (
                "`pod` (or `exported_pod`)".to_string(),
                "`namespace` (or `exported_namespace`)".to_string(),
            ),
        };
        if self.dcgm_series == 0 {
            problems.push(
                "no DCGM exporter series (DCGM_FI_PROF_GR_ENGINE_ACTIVE, DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_FB_USED, …): install NVIDIA's dcgm-exporter (the GPU Operator deploys it) and have Prometheus scrape it (a ServiceMonitor or scrape job), or choose a --from/--to it covers".to_string(),
            );
        } else if self.dcgm_attributed == 0 {
            let mut absent = Vec::new();
            if self.dcgm_without_uuid > 0 {
                absent.push(format!("{} have no `UUID` label", self.dcgm_without_uuid));
            }
            if self.dcgm_without_pod > 0 {
                absent.push(format!("{} have no {pod} label", self.dcgm_without_pod));
            }
            if self.dcgm_exporter_pod > 0 {
                absent.push(format!(
                    "{} carry only the exporter's own pod ({})",
                    self.dcgm_exporter_pod,
                    self.exporter_pod.as_deref().unwrap_or("dcgm-exporter")
                ));
            }
            if self.dcgm_without_namespace > 0 {
                absent.push(format!(
                    "{} name a pod but have no {namespace} label",
                    self.dcgm_without_namespace
                ));
            }
            problems.push(format!(
                "none of the {} DCGM series names a workload's pod: {}. Run dcgm-exporter with its Kubernetes pod mapping (--kubernetes, DCGM_EXPORTER_KUBERNETES=true; the GPU Operator's default) so each GPU's series carry its pod's {pod} and {namespace}, or name the labels your relabelling uses with --dcgm-pod-label and --dcgm-namespace-label",
                self.dcgm_series,
                absent.join(", ")
            ));
        }
        if self.ksm_series == 0 {
            problems.push(
                "no kube-state-metrics series (kube_pod_owner, kube_pod_container_resource_requests, kube_pod_created, kube_pod_status_phase, kube_replicaset_owner, …): install kube-state-metrics (e.g. with kube-prometheus-stack) and have Prometheus scrape it; without them no GPU can be tied to its workload, its owner, its GPU requests or its phase".to_string(),
            );
        } else {
            if self.ksm_gpu_requests == 0 {
                problems.push(format!(
                    "{} kube-state-metrics series, but no kube_pod_container_resource_requests with resource=\"nvidia_com_gpu\" (or nvidia_com_mig_*): a pod without GPU requests holds no GPU, so every GPU drops out; let kube-state-metrics export the pods' resource requests (check its --resources and --metric-allowlist)",
                    self.ksm_series
                ));
            }
            if self.ksm_exported_labels > 0 {
                problems.push(format!(
                    "{} kube-state-metrics series carry `exported_pod`/`exported_namespace`: Prometheus renamed kube-state-metrics' own `pod`/`namespace` labels, so its series describe its own pod; scrape it with honor_labels: true (ServiceMonitor honorLabels: true)",
                    self.ksm_exported_labels
                ));
            }
        }
        if problems.is_empty() {
            return Ok(());
        }
        let time = |t: i64| {
            jiff::Timestamp::from_second(t).map_or_else(|_| t.to_string(), |t| t.to_string())
        };
        Err(MissingSeries {
            source_name: source_name.to_string(),
            from: time(from),
            to: time(to),
            problems,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::openmetrics::read_samples;

    fn coverage_of(text: &str, names: WorkloadLabels) -> Coverage {
        let mut coverage = Coverage::new(names);
        read_samples(text.as_bytes(), "t.om", |s| {
            coverage.observe(s);
            Ok(())
        })
        .unwrap();
        coverage
    }

    fn problems(text: &str) -> Vec<String> {
        match coverage_of(text, WorkloadLabels::default()).check("http://prom", 0, 3600) {
            Ok(()) => vec![],
            Err(e) => e.problems,
        }
    }

    const GPU: &str = "DCGM_FI_PROF_GR_ENGINE_ACTIVE{UUID=\"GPU-1\",namespace=\"ml\",pod=\"train-0\"} 0.5 60\nDCGM_FI_PROF_GR_ENGINE_ACTIVE{UUID=\"GPU-1\",namespace=\"ml\",pod=\"train-0\"} 0.5 120\n";
    const REQUEST: &str = "kube_pod_container_resource_requests{namespace=\"ml\",pod=\"train-0\",container=\"c\",resource=\"nvidia_com_gpu\"} 1 60\n";

    #[test]
    fn dcgm_series_with_pods_and_gpu_requests_lack_nothing() {
        let coverage = coverage_of(&format!("{GPU}{REQUEST}"), WorkloadLabels::default());
        assert_eq!(coverage.samples, 3);
        assert_eq!((coverage.dcgm_series, coverage.dcgm_attributed), (1, 1));
        assert_eq!((coverage.ksm_series, coverage.ksm_gpu_requests), (1, 1));
        assert_eq!(coverage.check("p", 0, 60), Ok(()));
    }

    #[test]
    fn no_kube_state_metrics_is_named_with_what_to_install() {
        let p = problems(GPU);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with("no kube-state-metrics series (kube_pod_owner")
                && p[0].contains("install kube-state-metrics"),
            "{p:?}"
        );
    }

    #[test]
    fn no_dcgm_series_is_named_with_what_to_install() {
        let p = problems(REQUEST);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].starts_with("no DCGM exporter series")
                && p[0].contains("install NVIDIA's dcgm-exporter"),
            "{p:?}"
        );
    }

    #[test]
    fn dcgm_series_without_workload_labels_say_which_labels_are_absent() {
        let text = concat!(
            "DCGM_FI_DEV_FB_USED{UUID=\"GPU-1\",gpu=\"0\"} 1 60\n",
            "DCGM_FI_DEV_FB_USED{UUID=\"GPU-2\",pod=\"nvidia-dcgm-exporter-x\",namespace=\"gpu-operator\"} 1 60\n",
            "DCGM_FI_DEV_FB_USED{UUID=\"GPU-3\",pod=\"train-0\"} 1 60\n",
            "DCGM_FI_DEV_FB_USED{gpu=\"4\"} 1 60\n",
        );
        let e = coverage_of(text, WorkloadLabels::default())
            .check("http://prom", 0, 3600)
            .unwrap_err();
        let dcgm = &e.problems[0];
        for part in [
            "none of the 4 DCGM series names a workload's pod",
            "1 have no `UUID` label",
            "1 have no `pod` (or `exported_pod`) label",
            "1 carry only the exporter's own pod (nvidia-dcgm-exporter-x)",
            "1 name a pod but have no `namespace` (or `exported_namespace`) label",
            "--kubernetes",
            "--dcgm-pod-label",
        ] {
            assert!(dcgm.contains(part), "{part:?} not in {dcgm}");
        }
        assert!(e.problems[1].starts_with("no kube-state-metrics series"));
        let message = e.to_string();
        assert!(
            message.starts_with(
                "http://prom between 1970-01-01T00:00:00Z and 1970-01-01T01:00:00Z lacks what gpu-reaper needs:\n  - none of"
            ),
            "{message}"
        );
    }

    #[test]
    fn overridden_label_names_are_the_ones_named() {
        let names = WorkloadLabels {
            pod: Some("kubernetes_pod_name".into()),
            namespace: Some("kubernetes_namespace".into()),
        };
        let e = coverage_of(
            "DCGM_FI_DEV_FB_USED{UUID=\"GPU-1\",pod=\"p\"} 1 60\n",
            names.clone(),
        )
        .check("p", 0, 60)
        .unwrap_err();
        assert!(
            e.problems[0].contains("1 have no `kubernetes_pod_name` label"),
            "{e}"
        );
        let c = coverage_of(
            "DCGM_FI_DEV_FB_USED{UUID=\"GPU-1\",kubernetes_pod_name=\"p\",kubernetes_namespace=\"n\"} 1 60\n",
            names,
        );
        assert_eq!(c.dcgm_attributed, 1);
    }

    #[test]
    fn kube_state_metrics_without_gpu_requests_or_with_renamed_labels_is_named() {
        let text = format!(
            "{GPU}kube_pod_owner{{namespace=\"monitoring\",pod=\"ksm-0\",exported_namespace=\"ml\",exported_pod=\"train-0\",owner_kind=\"Job\",owner_name=\"t\"}} 1 60\n"
        );
        let p = problems(&text);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(
            p[0].contains(
                "no kube_pod_container_resource_requests with resource=\"nvidia_com_gpu\""
            ),
            "{p:?}"
        );
        assert!(p[1].contains("honor_labels: true"), "{p:?}");
    }
}
