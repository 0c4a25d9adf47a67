//! Writes the bundled sample telemetry trace that `gpu-reaper backtest` replays by default
//! (`config/samples/trace.om.gz`; see `docs/sample-trace.md`).
//!
//! ```text
//! cargo run --release --example make_sample_trace -- config/samples/trace.om.gz
//! ```
//!
//! The trace is OpenMetrics text (loadable with `promtool tsdb create-blocks-from
//! openmetrics`): 8 hours from 2026-11-02T00:00:00Z, one sample every 60 s, of DCGM exporter
//! and kube-state-metrics series for about thirty workloads on eight nodes, each workload a
//! scenario the reaper must get right (idle notebooks, idle inference, a busy 8-GPU job
//! with 7 idle GPUs, hung and crash-looping jobs, a telemetry gap, MIG, a GPU without
//! profiling metrics, ...).
//!
//! Deterministic: every random stream is a splitmix64 seeded from a fixed seed and the
//! stream's name, so regenerating gives identical bytes. Only std is used; an output path
//! ending in `.gz` is compressed by piping through `gzip -9 -n` (no name, no timestamp).
//! `-` writes the uncompressed text to stdout. A per-workload summary goes to stderr.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::{Command, Stdio};

/// 2026-11-02T00:00:00Z.
const T0: i64 = 1_793_577_600;
/// Seconds between samples.
const STEP: i64 = 60;
/// Samples per series: 8 hours.
const STEPS: usize = 480;
/// Seed of every random stream ("gpu-reap").
const SEED: u64 = 0x6770_752d_7265_6170;
/// The policy threshold the summary uses (5 % engine activity).
const THRESHOLD: f64 = 0.05;

// ---------------------------------------------------------------------------------------
// Randomness: splitmix64, one named stream per purpose so streams are independent.

struct Rng(u64);

impl Rng {
    fn new(stream: &str) -> Self {
        // FNV-1a of the stream name, mixed with the seed.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in stream.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        Rng(h ^ SEED)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform integer in [lo, hi].
    fn int(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    /// Approximately standard normal (Irwin–Hall: plain IEEE arithmetic, no libm, so the
    /// bytes do not depend on the platform's `ln`/`cos`).
    fn normal(&mut self) -> f64 {
        (0..12).map(|_| self.unit()).sum::<f64>() - 6.0
    }

    /// `n` characters of the alphabet Kubernetes uses for generated name suffixes.
    fn k8s_suffix(&mut self, n: usize) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        (0..n)
            .map(|_| ALPHABET[(self.next_u64() % ALPHABET.len() as u64) as usize] as char)
            .collect()
    }

    /// A random (version 4) UUID.
    fn uuid(&mut self) -> String {
        let a = self.next_u64();
        let b = self.next_u64();
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0x0fff,
            0x8000 | ((b >> 48) & 0x3fff),
            b & 0xffff_ffff_ffff
        )
    }
}

// ---------------------------------------------------------------------------------------
// The cluster.

#[derive(Clone, Copy, PartialEq)]
enum Model {
    H100,
    A100,
    L4,
    T4,
}

impl Model {
    fn name(self) -> &'static str {
        match self {
            Model::H100 => "NVIDIA H100 80GB HBM3",
            Model::A100 => "NVIDIA A100-SXM4-40GB",
            Model::L4 => "NVIDIA L4",
            Model::T4 => "Tesla T4",
        }
    }
    /// Power draw (W) with no work and no context.
    fn idle_watts(self) -> f64 {
        match self {
            Model::H100 => 67.0,
            Model::A100 => 54.0,
            Model::L4 => 16.0,
            Model::T4 => 11.0,
        }
    }
    fn max_watts(self) -> f64 {
        match self {
            Model::H100 => 700.0,
            Model::A100 => 400.0,
            Model::L4 => 72.0,
            Model::T4 => 70.0,
        }
    }
    /// Real PCI bus ids of these boards in common 8/4/1-GPU servers.
    fn pci_bus_id(self, index: usize) -> String {
        let bus = match self {
            Model::H100 => ["53", "64", "75", "86", "97", "A8", "B9", "CA"][index],
            Model::A100 => ["07", "0F", "47", "4E", "87", "90", "B7", "BD"][index],
            Model::L4 => ["38", "3A", "3C", "3E"][index],
            Model::T4 => return "00000000:00:1E.0".to_string(),
        };
        format!("00000000:{bus}:00.0")
    }
    /// Whether the exporter reports DCGM_FI_PROF_* (not on this T4, a vGPU-style guest).
    fn profiling(self) -> bool {
        self != Model::T4
    }
}

/// How a node's DCGM series name the workload (see `dcgm_labels`).
#[derive(Clone, Copy, PartialEq)]
enum Convention {
    /// `namespace`, `pod`, `container` are the workload's (honor_labels=true).
    Direct,
    /// `namespace`/`pod`/`container` are the exporter's own, the workload's are
    /// `exported_*` (honor_labels=false).
    Exported,
}

struct Node {
    name: &'static str,
    /// `Hostname`, or `hostname` as the newest exporter spells it.
    host_key: &'static str,
    driver: &'static str,
    model: Model,
    gpus: usize,
    convention: Convention,
    exporter_pod: String,
}

/// Activity of one GPU during a segment of the trace.
#[derive(Clone, Copy)]
enum Act {
    /// Steady work around this engine activity, with the odd 1–2 min checkpoint dip.
    Busy(f64),
    /// Production inference traffic: a night-time dip then the morning ramp, times this.
    Diurnal(f64),
    /// Interactive use: bursts of 4–15 min of work with 1–6 min pauses.
    Sessions,
    /// Short bursts (`len` min) starting every `every` min, idle in between.
    Bursts {
        every: (usize, usize),
        len: (usize, usize),
    },
    /// Nothing running: engine 0–0.01.
    Idle,
    /// Exactly 0 (hung process, crash loop, unallocated).
    Zero,
    /// Waiting on input: engine ~0.02 while PCIe receive is ~5 GB/s.
    Starved,
    /// No samples at all.
    Missing,
}

/// `act` with `fb_mib` of framebuffer in use, from the previous segment's end to `until`
/// (minutes since the trace start, exclusive).
#[derive(Clone, Copy)]
struct Seg {
    until: usize,
    act: Act,
    fb_mib: f64,
}

fn seg(until_min: usize, act: Act, fb_mib: f64) -> Seg {
    Seg {
        until: until_min,
        act,
        fb_mib,
    }
}

fn all(act: Act, fb_mib: f64) -> Vec<Seg> {
    vec![seg(STEPS, act, fb_mib)]
}

#[derive(Clone, Copy)]
struct Sample {
    act: f64,
    fb: f64,
    power: f64,
    rx: f64,
}

/// One DCGM entity: a whole GPU, a MIG instance (`mig`), or a MIG parent reporting only
/// device-level power (`power_only`).
struct Gpu {
    node: usize,
    index: usize,
    mig: Option<(&'static str, &'static str)>,
    power_only: bool,
    pod: Option<usize>,
    segs: Vec<Seg>,
    pcie: bool,
    /// First minute with samples (the pod starts late).
    start: usize,
    samples: Vec<Option<Sample>>,
}

struct Workload {
    ns: &'static str,
    kind: &'static str,
    name: &'static str,
    scenario: &'static str,
    gpus: u32,
}

struct Pod {
    workload: usize,
    ns: &'static str,
    name: String,
    uid: String,
    owner_kind: &'static str,
    owner_name: String,
    /// The owning ReplicaSet's Deployment.
    deployment: Option<&'static str>,
    created: i64,
    labels: Vec<(String, String)>,
    annotations: Vec<(String, String)>,
    container: &'static str,
    node: Option<usize>,
    resource: &'static str,
    gpus: u32,
    phase: &'static str,
    waiting: Option<&'static str>,
}

impl Pod {
    /// First minute the pod exists (kube-state-metrics reports it).
    fn first_minute(&self) -> usize {
        if self.created <= T0 {
            0
        } else {
            ((self.created - T0 + STEP - 1) / STEP) as usize
        }
    }
}

/// What a pod spec says; `World::pods` turns it into pods.
struct PodSpec {
    ns: &'static str,
    kind: &'static str,
    name: &'static str,
    scenario: &'static str,
    replicas: usize,
    gpus_per_pod: u32,
    /// Creation time, minutes relative to the trace start (negative: before it).
    created_min: i64,
    container: &'static str,
    owner: Option<&'static str>,
    extra_labels: Vec<(&'static str, &'static str)>,
    extra_annotations: Vec<(&'static str, String)>,
    resource: &'static str,
    phase: &'static str,
    waiting: Option<&'static str>,
}

impl PodSpec {
    fn new(
        ns: &'static str,
        kind: &'static str,
        name: &'static str,
        scenario: &'static str,
    ) -> Self {
        PodSpec {
            ns,
            kind,
            name,
            scenario,
            replicas: 1,
            gpus_per_pod: 1,
            created_min: -24 * 60,
            container: "main",
            owner: None,
            extra_labels: Vec::new(),
            extra_annotations: Vec::new(),
            resource: "nvidia_com_gpu",
            phase: "Running",
            waiting: None,
        }
    }
    fn replicas(mut self, n: usize, gpus_per_pod: u32) -> Self {
        self.replicas = n;
        self.gpus_per_pod = gpus_per_pod;
        self
    }
    fn created(mut self, min: i64) -> Self {
        self.created_min = min;
        self
    }
    fn container(mut self, c: &'static str) -> Self {
        self.container = c;
        self
    }
    fn owner(mut self, email: &'static str) -> Self {
        self.owner = Some(email);
        self
    }
    fn label(mut self, k: &'static str, v: &'static str) -> Self {
        self.extra_labels.push((k, v));
        self
    }
    fn annotation(mut self, k: &'static str, v: String) -> Self {
        self.extra_annotations.push((k, v));
        self
    }
    fn resource(mut self, r: &'static str) -> Self {
        self.resource = r;
        self
    }
    fn state(mut self, phase: &'static str, waiting: Option<&'static str>) -> Self {
        self.phase = phase;
        self.waiting = waiting;
        self
    }
}

struct World {
    nodes: Vec<Node>,
    gpus: Vec<Gpu>,
    pods: Vec<Pod>,
    workloads: Vec<Workload>,
}

impl World {
    fn node(
        &mut self,
        name: &'static str,
        host_key: &'static str,
        driver: &'static str,
        model: Model,
        gpus: usize,
        convention: Convention,
    ) -> usize {
        let exporter_pod = format!(
            "nvidia-dcgm-exporter-{}",
            Rng::new(&format!("exporter/{name}")).k8s_suffix(5)
        );
        self.nodes.push(Node {
            name,
            host_key,
            driver,
            model,
            gpus,
            convention,
            exporter_pod,
        });
        self.nodes.len() - 1
    }

    /// Creates the workload and its pods (with names as their controllers make them);
    /// returns the pod indices.
    fn pods(&mut self, spec: PodSpec) -> Vec<usize> {
        let w = self.workloads.len();
        self.workloads.push(Workload {
            ns: spec.ns,
            kind: spec.kind,
            name: spec.name,
            scenario: spec.scenario,
            gpus: spec.gpus_per_pod * spec.replicas as u32,
        });
        let mut rng = Rng::new(&format!("workload/{}/{}", spec.ns, spec.name));
        let rs = format!("{}-{}", spec.name, rng.k8s_suffix(10));
        let mut out = Vec::new();
        for r in 0..spec.replicas {
            let (pod_name, owner_kind, owner_name, deployment) = match spec.kind {
                "Deployment" => (
                    format!("{rs}-{}", rng.k8s_suffix(5)),
                    "ReplicaSet",
                    rs.clone(),
                    Some(spec.name),
                ),
                "Notebook" => (
                    format!("{}-0", spec.name),
                    "StatefulSet",
                    spec.name.to_string(),
                    None,
                ),
                "Job" => (
                    format!("{}-{}", spec.name, rng.k8s_suffix(5)),
                    "Job",
                    spec.name.to_string(),
                    None,
                ),
                "PyTorchJob" => {
                    let role = if r == 0 {
                        "master-0".to_string()
                    } else {
                        format!("worker-{}", r - 1)
                    };
                    (
                        format!("{}-{role}", spec.name),
                        "PyTorchJob",
                        spec.name.to_string(),
                        None,
                    )
                }
                "RayCluster" => (
                    format!("{}-gpu-group-worker-{}", spec.name, rng.k8s_suffix(5)),
                    "RayCluster",
                    spec.name.to_string(),
                    None,
                ),
                _ => (spec.name.to_string(), "<none>", "<none>".to_string(), None),
            };
            let mut labels = vec![("app".to_string(), spec.name.to_string())];
            match spec.kind {
                "Deployment" => labels.push((
                    "pod_template_hash".into(),
                    rs[spec.name.len() + 1..].to_string(),
                )),
                "Notebook" => {
                    labels.push(("notebook_name".into(), spec.name.into()));
                    labels.push(("statefulset".into(), spec.name.into()));
                }
                "Job" => labels.push(("batch_kubernetes_io_job_name".into(), spec.name.into())),
                "PyTorchJob" => {
                    labels.push(("training_kubeflow_org_job_name".into(), spec.name.into()));
                    let role = if r == 0 { "master" } else { "worker" };
                    labels.push(("training_kubeflow_org_replica_type".into(), role.into()));
                }
                "RayCluster" => labels.push(("ray_io_cluster".into(), spec.name.into())),
                _ => {}
            }
            for (k, v) in &spec.extra_labels {
                labels.push((k.to_string(), v.to_string()));
            }
            let mut annotations = Vec::new();
            if let Some(email) = spec.owner {
                annotations.push(("gpureaper_io_owner".to_string(), email.to_string()));
            }
            for (k, v) in &spec.extra_annotations {
                annotations.push((k.to_string(), v.clone()));
            }
            // Replicas of one controller are created a few seconds to minutes apart.
            let created = T0 + spec.created_min * 60 + (r as i64) * rng.int(3, 90) as i64;
            self.pods.push(Pod {
                workload: w,
                ns: spec.ns,
                name: pod_name,
                uid: rng.uuid(),
                owner_kind,
                owner_name,
                deployment,
                created,
                labels,
                annotations,
                container: spec.container,
                node: None,
                resource: spec.resource,
                gpus: spec.gpus_per_pod,
                phase: spec.phase,
                waiting: spec.waiting,
            });
            out.push(self.pods.len() - 1);
        }
        out
    }

    /// Binds GPU `index` of `node` to `pod` with this activity.
    fn gpu(&mut self, pod: usize, node: usize, index: usize, segs: Vec<Seg>, pcie: bool) {
        self.pods[pod].node = Some(node);
        // The exporter attributes the GPU from the scrape after the pod starts.
        let start = if self.pods[pod].created > T0 {
            (self.pods[pod].first_minute() + 1).min(STEPS)
        } else {
            0
        };
        self.gpus.push(Gpu {
            node,
            index,
            mig: None,
            power_only: false,
            pod: Some(pod),
            segs,
            pcie,
            start,
            samples: Vec::new(),
        });
    }

    /// Binds a MIG instance of GPU `index` of `node` to `pod`.
    fn mig(
        &mut self,
        pod: usize,
        node: usize,
        index: usize,
        instance: (&'static str, &'static str),
        segs: Vec<Seg>,
    ) {
        self.gpu(pod, node, index, segs, false);
        self.gpus.last_mut().expect("just pushed").mig = Some(instance);
    }

    /// Every GPU of every node not bound above: unallocated (or a MIG parent).
    fn fill_unallocated(&mut self) {
        for n in 0..self.nodes.len() {
            for index in 0..self.nodes[n].gpus {
                let bound: Vec<&Gpu> = self
                    .gpus
                    .iter()
                    .filter(|g| g.node == n && g.index == index)
                    .collect();
                if bound.iter().any(|g| g.mig.is_none()) {
                    continue;
                }
                let power_only = !bound.is_empty();
                self.gpus.push(Gpu {
                    node: n,
                    index,
                    mig: None,
                    power_only,
                    pod: None,
                    segs: all(Act::Zero, 0.0),
                    pcie: false,
                    start: 0,
                    samples: Vec::new(),
                });
            }
        }
        self.gpus
            .sort_by_key(|g| (g.node, g.index, g.mig.map(|m| m.0)));
    }
}

// ---------------------------------------------------------------------------------------
// Activity.

/// Production traffic over the trace's hours (UTC 00:00–08:00): a night-time dip, then
/// the morning ramp. Linear between hourly anchors.
fn diurnal(minute: usize) -> f64 {
    const ANCHORS: [f64; 9] = [0.52, 0.45, 0.39, 0.35, 0.34, 0.38, 0.47, 0.60, 0.72];
    let h = minute as f64 / 60.0;
    let i = (h.floor() as usize).min(7);
    let f = h - i as f64;
    ANCHORS[i] * (1.0 - f) + ANCHORS[i + 1] * f
}

fn generate(gpu: &mut Gpu, model: Model, stream: &str) {
    let mut rng = Rng::new(stream);
    let mut burst_left = 0usize;
    let mut pause_left = 0usize;
    let mut next_burst = usize::MAX;
    let mut seg_start = 0usize;
    let mut dip_left = 0usize;
    let mut samples = Vec::with_capacity(STEPS);
    for minute in 0..STEPS {
        let s = *gpu
            .segs
            .iter()
            .find(|s| minute < s.until)
            .expect("segments cover the trace");
        if minute == seg_start {
            // A new segment: reset burst schedules.
            burst_left = 0;
            pause_left = 0;
            next_burst = match s.act {
                Act::Bursts { every, .. } => minute + rng.int(1, every.0.max(2)),
                _ => usize::MAX,
            };
        }
        if minute + 1 == s.until {
            seg_start = s.until;
        }
        if minute < gpu.start || matches!(s.act, Act::Missing) {
            samples.push(None);
            continue;
        }
        let idle = |rng: &mut Rng| {
            if rng.unit() < 0.55 {
                0.0
            } else {
                rng.range(0.0, 0.01)
            }
        };
        let mut jitter_fb = true;
        let act = match s.act {
            Act::Busy(mean) => {
                if dip_left == 0 && rng.unit() < 0.02 {
                    dip_left = rng.int(1, 2);
                }
                if dip_left > 0 {
                    dip_left -= 1;
                    rng.range(0.0, 0.03)
                } else {
                    (mean + 0.035 * rng.normal()).clamp(0.06, 0.99)
                }
            }
            Act::Diurnal(scale) => {
                (diurnal(minute) * scale + 0.04 * rng.normal()).clamp(0.08, 0.95)
            }
            Act::Sessions => {
                if burst_left == 0 && pause_left == 0 {
                    burst_left = rng.int(4, 15);
                    pause_left = rng.int(1, 6);
                }
                if burst_left > 0 {
                    burst_left -= 1;
                    rng.range(0.3, 0.9)
                } else {
                    pause_left -= 1;
                    rng.range(0.0, 0.03)
                }
            }
            Act::Bursts { every, len } => {
                if minute >= next_burst {
                    burst_left = rng.int(len.0, len.1);
                    next_burst = minute + rng.int(every.0, every.1);
                }
                if burst_left > 0 {
                    burst_left -= 1;
                    rng.range(0.4, 0.85)
                } else {
                    idle(&mut rng)
                }
            }
            Act::Idle => {
                jitter_fb = false;
                idle(&mut rng)
            }
            Act::Zero => {
                jitter_fb = false;
                0.0
            }
            Act::Starved => (0.02 + 0.006 * rng.normal()).clamp(0.004, 0.04),
            Act::Missing => unreachable!(),
        };
        let fb = if s.fb_mib > 0.0 && jitter_fb {
            (s.fb_mib + rng.range(-64.0, 64.0)).round()
        } else {
            s.fb_mib
        };
        let context_watts = if fb > 1024.0 { 3.0 } else { 0.0 };
        let power = (model.idle_watts()
            + context_watts
            + (model.max_watts() - model.idle_watts()) * act * 0.92
            + 1.2 * rng.normal())
        .max(model.idle_watts() * 0.8);
        let rx = match s.act {
            Act::Starved => 5.0e9 + 3.0e8 * rng.normal(),
            _ if act >= THRESHOLD => act * rng.range(1.0e8, 6.0e8),
            _ => rng.range(2.0e4, 4.0e5),
        }
        .round();
        samples.push(Some(Sample { act, fb, power, rx }));
    }
    gpu.samples = samples;
}

/// A MIG parent's power: the board's idle draw plus each instance's share of the rest.
fn mig_parent_power(world: &mut World, parent: usize) {
    let (node, index) = (world.gpus[parent].node, world.gpus[parent].index);
    let model = world.nodes[node].model;
    let mut rng = Rng::new(&format!("mig-power/{}/{index}", world.nodes[node].name));
    let mut samples = Vec::with_capacity(STEPS);
    for minute in 0..STEPS {
        let mut watts = model.idle_watts() + 4.0 + 1.2 * rng.normal();
        for g in world
            .gpus
            .iter()
            .filter(|g| g.node == node && g.index == index && g.mig.is_some())
        {
            let slices = match g.mig.map(|m| m.1) {
                Some("1g.5gb") => 1.0,
                Some("2g.10gb") => 2.0,
                Some("3g.20gb") => 3.0,
                _ => 7.0,
            };
            if let Some(s) = g.samples[minute] {
                watts += (model.max_watts() - model.idle_watts()) * s.act * 0.92 * slices / 7.0;
            }
        }
        samples.push(Some(Sample {
            act: 0.0,
            fb: 0.0,
            power: watts,
            rx: 0.0,
        }));
    }
    world.gpus[parent].samples = samples;
}

// ---------------------------------------------------------------------------------------
// The scenarios.

fn rfc3339(unix: i64) -> String {
    // Civil-from-days (Howard Hinnant), UTC.
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

fn build() -> World {
    use Act::*;
    use Convention::*;
    let mut w = World {
        nodes: Vec::new(),
        gpus: Vec::new(),
        pods: Vec::new(),
        workloads: Vec::new(),
    };
    let h100_a = w.node(
        "gpu-h100-a",
        "Hostname",
        "580.105.08",
        Model::H100,
        8,
        Direct,
    );
    let h100_b = w.node(
        "gpu-h100-b",
        "Hostname",
        "580.105.08",
        Model::H100,
        8,
        Direct,
    );
    let h100_c = w.node(
        "gpu-h100-c",
        "Hostname",
        "580.105.08",
        Model::H100,
        8,
        Exported,
    );
    let h100_d = w.node(
        "gpu-h100-d",
        "Hostname",
        "580.105.08",
        Model::H100,
        8,
        Direct,
    );
    let h100_e = w.node(
        "gpu-h100-e",
        "Hostname",
        "580.105.08",
        Model::H100,
        8,
        Direct,
    );
    let a100_a = w.node(
        "gpu-a100-a",
        "Hostname",
        "580.126.09",
        Model::A100,
        8,
        Direct,
    );
    let a100_b = w.node(
        "gpu-a100-b",
        "Hostname",
        "580.126.09",
        Model::A100,
        8,
        Direct,
    );
    let l4_a = w.node("gpu-l4-a", "hostname", "595.58.03", Model::L4, 4, Direct);
    let t4_a = w.node("gpu-t4-a", "Hostname", "590.48.01", Model::T4, 1, Direct);

    // 1. Notebooks left idle overnight: interactive work, then idle holding memory.
    let notebooks = [
        (
            "nb-alice",
            "alice@example.com",
            -240,
            h100_c,
            0,
            95,
            34_200.0,
        ),
        ("nb-bob", "bob@example.com", -60, h100_c, 1, 70, 22_600.0),
        (
            "nb-carol",
            "carol@example.com",
            -120,
            a100_a,
            2,
            110,
            28_100.0,
        ),
        ("nb-dave", "dave@example.com", -180, l4_a, 2, 120, 20_500.0),
    ];
    for (name, owner, created, node, index, active_min, fb) in notebooks {
        let p = w.pods(
            PodSpec::new("research", "Notebook", name, "1 notebook idle overnight")
                .created(created)
                .container(name)
                .owner(owner),
        );
        w.gpu(
            p[0],
            node,
            index,
            vec![seg(active_min, Sessions, fb), seg(STEPS, Idle, fb)],
            false,
        );
    }

    // 2a. Busy inference: 3 replicas, diurnal traffic.
    let p = w.pods(
        PodSpec::new(
            "inference",
            "Deployment",
            "llm-chat",
            "2 inference busy (diurnal)",
        )
        .replicas(3, 1)
        .created(-74 * 60)
        .container("vllm")
        .owner("erin@example.com"),
    );
    for (r, pod) in p.into_iter().enumerate() {
        w.gpu(pod, h100_b, r, all(Diurnal(1.0), 71_800.0), true);
    }
    // 2b. Inference idle: weights loaded (74,166 MiB like the real vLLM scrape), no traffic.
    let p = w.pods(
        PodSpec::new(
            "inference",
            "Deployment",
            "vllm-qwen2-72b",
            "2 inference idle (weights loaded, no traffic)",
        )
        .replicas(1, 2)
        .created(-26 * 60)
        .container("vllm")
        .owner("grace@example.com"),
    );
    w.gpu(p[0], h100_b, 3, all(Zero, 74_166.0), false);
    w.gpu(p[0], h100_b, 4, all(Zero, 74_150.0), false);
    // 2c. Bursty inference: 2–5 min bursts every 10–40 min.
    let p = w.pods(
        PodSpec::new("inference", "Deployment", "reranker", "2 inference bursty")
            .created(-8 * 24 * 60)
            .container("triton")
            .owner("erin@example.com"),
    );
    w.gpu(
        p[0],
        l4_a,
        0,
        all(
            Bursts {
                every: (10, 40),
                len: (2, 5),
            },
            6_800.0,
        ),
        false,
    );

    // 3. 8-GPU training job: GPU 0 busy, the other 7 idle.
    let p = w.pods(
        PodSpec::new(
            "training",
            "Job",
            "llama3-8b-sft",
            "3 8-GPU job, only GPU 0 busy",
        )
        .replicas(1, 8)
        .created(-5 * 60)
        .container("pytorch")
        .owner("frank@example.com"),
    );
    w.gpu(p[0], h100_a, 0, all(Busy(0.9), 61_000.0), false);
    for i in 1..8 {
        w.gpu(p[0], h100_a, i, all(Idle, 520.0), false);
    }

    // 4. Batch job: works 2 h, then hangs with the GPUs at 0 and memory empty.
    let p = w.pods(
        PodSpec::new(
            "ml-platform",
            "Job",
            "nightly-embed-backfill",
            "4 batch job hung after 2 h",
        )
        .replicas(1, 2)
        .created(-6)
        .container("worker"),
    );
    for i in [2, 3] {
        w.gpu(
            p[0],
            h100_c,
            i,
            vec![seg(120, Busy(0.8), 30_000.0), seg(STEPS, Zero, 0.0)],
            true,
        );
    }

    // 5a. Crash loop: GPU bound, container waiting in CrashLoopBackOff, zeros.
    let p = w.pods(
        PodSpec::new(
            "ml-platform",
            "Job",
            "feature-etl",
            "5 CrashLoopBackOff for hours",
        )
        .created(-3 * 60)
        .container("etl")
        .owner("judy@example.com")
        .state("Running", Some("CrashLoopBackOff")),
    );
    w.gpu(p[0], a100_a, 1, all(Zero, 0.0), false);
    // 5b. Pending for hours: 4 GPUs requested, unschedulable, no DCGM series.
    w.pods(
        PodSpec::new("training", "Job", "llama-70b-lora", "5 Pending for hours")
            .replicas(1, 4)
            .created(-60)
            .container("pytorch")
            .owner("frank@example.com")
            .state("Pending", None),
    );

    // 6. Data-starved training: engine ~0.02, PCIe RX ~5 GB/s.
    let p = w.pods(
        PodSpec::new("training", "Job", "resnet50-imagenet", "6 data-starved")
            .created(-90)
            .container("pytorch")
            .owner("mallory@example.com"),
    );
    w.gpu(p[0], h100_b, 5, all(Starved, 31_000.0), true);

    // 7. Telemetry gap: busy until 02:45, idle, no samples 03:00–04:30, idle.
    let p = w.pods(
        PodSpec::new(
            "ml-platform",
            "Deployment",
            "embedder-staging",
            "7 telemetry gap 03:00–04:30",
        )
        .created(-2 * 24 * 60)
        .container("server"),
    );
    w.gpu(
        p[0],
        l4_a,
        1,
        vec![
            seg(165, Busy(0.5), 9_200.0),
            seg(180, Idle, 9_200.0),
            seg(270, Missing, 0.0),
            seg(STEPS, Idle, 9_200.0),
        ],
        false,
    );

    // 8. Young: a bare pod created 10 minutes before the trace ends, idle.
    let p = w.pods(
        PodSpec::new("research", "Pod", "scratch-test", "8 young (created 07:50)")
            .created(STEPS as i64 - 10)
            .container("scratch"),
    );
    w.gpu(p[0], l4_a, 3, all(Idle, 410.0), false);

    // 9. Exempt, idle all along.
    let p = w.pods(
        PodSpec::new("research", "Deployment", "baseline-bench", "9 exempt")
            .created(-6 * 24 * 60)
            .container("bench")
            .owner("ivan@example.com")
            .label("gpureaper_io_exempt", "true"),
    );
    w.gpu(p[0], h100_c, 5, all(Idle, 40_500.0), false);

    // 10. Snoozed until 04:00, idle all along.
    let p = w.pods(
        PodSpec::new(
            "research",
            "Deployment",
            "summarizer-dev",
            "10 snoozed until 04:00",
        )
        .created(-24 * 60)
        .container("app")
        .owner("ivan@example.com")
        .annotation("gpureaper_io_snooze_until", rfc3339(T0 + 4 * 3600)),
    );
    w.gpu(p[0], h100_c, 4, all(Idle, 15_000.0), false);

    // 11. Regret: busy, idle 2 h 15 min holding memory, busy 1 h, idle.
    let p = w.pods(
        PodSpec::new(
            "research",
            "Deployment",
            "rag-playground",
            "11 regret (idle 2h15, busy again)",
        )
        .created(-2 * 24 * 60)
        .container("app")
        .owner("heidi@example.com"),
    );
    w.gpu(
        p[0],
        h100_b,
        6,
        vec![
            seg(30, Busy(0.55), 16_000.0),
            seg(165, Idle, 16_000.0),
            seg(225, Busy(0.55), 16_000.0),
            seg(STEPS, Idle, 16_000.0),
        ],
        true,
    );

    // 12. MIG: two instances of A100 GPU 0, one idle, one busy.
    let p = w.pods(
        PodSpec::new(
            "inference",
            "Deployment",
            "tokenizer-svc",
            "12 MIG 1g.5gb idle",
        )
        .created(-3 * 24 * 60)
        .container("server")
        .resource("nvidia_com_mig_1g_5gb"),
    );
    w.mig(p[0], a100_a, 0, ("13", "1g.5gb"), all(Idle, 3_100.0));
    let p = w.pods(
        PodSpec::new("training", "Job", "distil-eval", "12 MIG 3g.20gb busy")
            .created(-45)
            .container("eval")
            .owner("mallory@example.com")
            .resource("nvidia_com_mig_3g_20gb"),
    );
    w.mig(p[0], a100_a, 0, ("5", "3g.20gb"), all(Busy(0.75), 14_500.0));

    // 13. No profiling metrics (T4, vGPU-style): GPU_UTIL only, idle holding memory.
    let p = w.pods(
        PodSpec::new(
            "inference",
            "Deployment",
            "ocr-t4",
            "13 no profiling metrics, idle",
        )
        .created(-3 * 24 * 60)
        .container("ocr")
        .owner("judy@example.com"),
    );
    w.gpu(p[0], t4_a, 0, all(Idle, 5_120.0), false);

    // Background: ordinary busy workloads.
    let p = w.pods(
        PodSpec::new(
            "training",
            "PyTorchJob",
            "bert-large-pretrain",
            "busy (background)",
        )
        .replicas(2, 4)
        .created(-9 * 60)
        .container("pytorch")
        .owner("frank@example.com"),
    );
    for (r, pod) in p.into_iter().enumerate() {
        for i in 0..4 {
            w.gpu(pod, h100_d, r * 4 + i, all(Busy(0.9), 72_000.0), false);
        }
    }
    let p = w.pods(
        PodSpec::new(
            "inference",
            "Deployment",
            "mixtral-8x7b",
            "busy (background)",
        )
        .replicas(2, 2)
        .created(-5 * 24 * 60)
        .container("vllm")
        .owner("erin@example.com"),
    );
    for (r, pod) in p.into_iter().enumerate() {
        for i in 0..2 {
            w.gpu(pod, h100_e, r * 2 + i, all(Diurnal(0.8), 70_500.0), false);
        }
    }
    let p = w.pods(
        PodSpec::new("training", "Job", "codegen-eval", "busy (background)")
            .replicas(1, 2)
            .created(-40)
            .container("eval"),
    );
    for i in [4, 5] {
        w.gpu(p[0], h100_e, i, all(Busy(0.7), 45_000.0), false);
    }
    let p = w.pods(
        PodSpec::new(
            "research",
            "RayCluster",
            "ray-dev",
            "busy (background, periodic tasks)",
        )
        .replicas(1, 2)
        .created(-30 * 60)
        .container("ray-worker")
        .owner("heidi@example.com"),
    );
    for i in [6, 7] {
        w.gpu(
            p[0],
            h100_e,
            i,
            all(
                Bursts {
                    every: (8, 20),
                    len: (4, 9),
                },
                25_000.0,
            ),
            false,
        );
    }
    let p = w.pods(
        PodSpec::new("training", "Job", "detr-coco", "busy (background)")
            .replicas(1, 4)
            .created(-12 * 60)
            .container("pytorch")
            .owner("mallory@example.com"),
    );
    for i in 3..7 {
        w.gpu(p[0], a100_a, i, all(Busy(0.8), 33_000.0), true);
    }
    let p = w.pods(
        PodSpec::new("training", "Job", "hp-sweep-lr", "busy (background)")
            .replicas(4, 2)
            .created(-150)
            .container("trial")
            .owner("bob@example.com"),
    );
    for (r, pod) in p.into_iter().enumerate() {
        let level = [0.92, 0.61, 0.78, 0.55][r];
        let fb = [36_000.0, 21_000.0, 29_500.0, 19_800.0][r];
        for i in 0..2 {
            w.gpu(pod, a100_b, r * 2 + i, all(Busy(level), fb), false);
        }
    }

    // 14. Unallocated: every GPU not bound above (H100-b 7, H100-c 6–7, A100-a 7), and
    // the MIG parent's device-level power.
    w.fill_unallocated();
    for g in 0..w.gpus.len() {
        let node = &w.nodes[w.gpus[g].node];
        let stream = format!(
            "samples/{}/{}/{}",
            node.name,
            w.gpus[g].index,
            w.gpus[g].mig.map_or("", |m| m.0)
        );
        let model = node.model;
        if !w.gpus[g].power_only {
            generate(&mut w.gpus[g], model, &stream);
        }
    }
    for g in 0..w.gpus.len() {
        if w.gpus[g].power_only {
            mig_parent_power(&mut w, g);
        }
    }
    w
}

// ---------------------------------------------------------------------------------------
// OpenMetrics output.

fn escape(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

fn labels(pairs: &[(&str, &str)]) -> String {
    let mut s = String::from("{");
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{k}=\"{}\"", escape(v));
    }
    s.push('}');
    s
}

/// `v` with at most `decimals` decimals, trailing zeros dropped.
fn num(v: f64, decimals: usize) -> String {
    let mut s = format!("{v:.decimals$}");
    if s.contains('.') {
        while s.ends_with('0') {
            s.pop();
        }
        if s.ends_with('.') {
            s.pop();
        }
    }
    if s == "-0" { "0".to_string() } else { s }
}

struct Out {
    text: String,
    series: usize,
    samples: usize,
    family_series: Vec<(&'static str, usize, usize)>,
}

impl Out {
    fn family(&mut self, name: &'static str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} gauge");
        self.family_series.push((name, 0, 0));
    }
    /// One series: `value(minute)` for each minute in `minutes` (None: no sample).
    fn series(
        &mut self,
        labels: &str,
        minutes: std::ops::Range<usize>,
        mut value: impl FnMut(usize) -> Option<String>,
    ) {
        let name = self.family_series.last().expect("family first").0;
        let mut any = false;
        for m in minutes {
            if let Some(v) = value(m) {
                let _ = writeln!(self.text, "{name}{labels} {v} {}", T0 + m as i64 * STEP);
                self.samples += 1;
                self.family_series.last_mut().expect("family").2 += 1;
                any = true;
            }
        }
        if any {
            self.series += 1;
            self.family_series.last_mut().expect("family").1 += 1;
        }
    }
}

fn dcgm_labels(w: &World, g: &Gpu) -> String {
    let node = &w.nodes[g.node];
    let gpu = g.index.to_string();
    let uuid = format!(
        "GPU-{}",
        Rng::new(&format!("uuid/{}/{}", node.name, g.index)).uuid()
    );
    let device = format!("nvidia{}", g.index);
    let pci = node.model.pci_bus_id(g.index);
    let mut l: Vec<(&str, &str)> = vec![
        ("gpu", &gpu),
        ("UUID", &uuid),
        ("pci_bus_id", &pci),
        ("device", &device),
        ("modelName", node.model.name()),
    ];
    if let Some((id, profile)) = g.mig {
        l.push(("GPU_I_PROFILE", profile));
        l.push(("GPU_I_ID", id));
    }
    l.push((node.host_key, node.name));
    l.push(("DCGM_FI_DRIVER_VERSION", node.driver));
    let exporter = [
        ("container", "nvidia-dcgm-exporter"),
        ("namespace", "gpu-operator"),
        ("pod", node.exporter_pod.as_str()),
    ];
    match (g.pod.map(|p| &w.pods[p]), node.convention) {
        (None, _) => l.extend(exporter),
        (Some(p), Convention::Direct) => {
            l.extend([
                ("container", p.container),
                ("namespace", p.ns),
                ("pod", p.name.as_str()),
            ]);
        }
        (Some(p), Convention::Exported) => {
            l.extend(exporter);
            l.extend([
                ("exported_container", p.container),
                ("exported_namespace", p.ns),
                ("exported_pod", p.name.as_str()),
            ]);
        }
    }
    labels(&l)
}

fn render(w: &World) -> Out {
    let mut o = Out {
        text: String::with_capacity(64 << 20),
        series: 0,
        samples: 0,
        family_series: Vec::new(),
    };
    let gl: Vec<String> = w.gpus.iter().map(|g| dcgm_labels(w, g)).collect();
    let model = |g: &Gpu| w.nodes[g.node].model;
    let all = 0..STEPS;

    o.family(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "Ratio of time the graphics engine is active.",
    );
    for (g, l) in w.gpus.iter().zip(&gl) {
        if model(g).profiling() && !g.power_only {
            o.series(l, all.clone(), |m| g.samples[m].map(|s| num(s.act, 6)));
        }
    }
    o.family("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).");
    for (g, l) in w.gpus.iter().zip(&gl) {
        if !model(g).profiling() {
            o.series(l, all.clone(), |m| {
                g.samples[m].map(|s| num((s.act * 100.0).round(), 0))
            });
        }
    }
    o.family("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).");
    for (g, l) in w.gpus.iter().zip(&gl) {
        if !g.power_only {
            o.series(l, all.clone(), |m| g.samples[m].map(|s| num(s.fb, 0)));
        }
    }
    o.family("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).");
    for (g, l) in w.gpus.iter().zip(&gl) {
        if g.mig.is_none() {
            o.series(l, all.clone(), |m| g.samples[m].map(|s| num(s.power, 3)));
        }
    }
    o.family("DCGM_FI_PROF_PCIE_RX_BYTES", "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.");
    for (g, l) in w.gpus.iter().zip(&gl) {
        if g.pcie {
            o.series(l, all.clone(), |m| g.samples[m].map(|s| num(s.rx, 0)));
        }
    }

    // kube-state-metrics: constant values, sampled while the pod exists.
    let pod_range = |p: &Pod| p.first_minute()..STEPS;
    let one = |_| Some("1".to_string());
    o.family("kube_pod_owner", "Information about the Pod's owner.");
    for p in &w.pods {
        let controller = if p.owner_kind == "<none>" {
            "<none>"
        } else {
            "true"
        };
        let l = labels(&[
            ("namespace", p.ns),
            ("pod", &p.name),
            ("uid", &p.uid),
            ("owner_kind", p.owner_kind),
            ("owner_name", &p.owner_name),
            ("owner_is_controller", controller),
        ]);
        o.series(&l, pod_range(p), one);
    }
    o.family(
        "kube_replicaset_owner",
        "Information about the ReplicaSet's owner.",
    );
    let mut seen: Vec<&str> = Vec::new();
    for p in &w.pods {
        let Some(deployment) = p.deployment else {
            continue;
        };
        if seen.contains(&p.owner_name.as_str()) {
            continue;
        }
        seen.push(&p.owner_name);
        let l = labels(&[
            ("namespace", p.ns),
            ("replicaset", &p.owner_name),
            ("owner_kind", "Deployment"),
            ("owner_name", deployment),
            ("owner_is_controller", "true"),
        ]);
        o.series(&l, pod_range(p), one);
    }
    o.family("kube_pod_created", "Unix creation timestamp");
    for p in &w.pods {
        let l = labels(&[("namespace", p.ns), ("pod", &p.name), ("uid", &p.uid)]);
        o.series(&l, pod_range(p), |_| Some(p.created.to_string()));
    }
    o.family(
        "kube_pod_labels",
        "Kubernetes labels converted to Prometheus labels.",
    );
    for p in &w.pods {
        let keys: Vec<String> = p.labels.iter().map(|(k, _)| format!("label_{k}")).collect();
        let mut l: Vec<(&str, &str)> = vec![("namespace", p.ns), ("pod", &p.name), ("uid", &p.uid)];
        l.extend(
            keys.iter()
                .zip(&p.labels)
                .map(|(k, (_, v))| (k.as_str(), v.as_str())),
        );
        o.series(&labels(&l), pod_range(p), one);
    }
    o.family(
        "kube_pod_annotations",
        "Kubernetes annotations converted to Prometheus labels.",
    );
    for p in w.pods.iter().filter(|p| !p.annotations.is_empty()) {
        let keys: Vec<String> = p
            .annotations
            .iter()
            .map(|(k, _)| format!("annotation_{k}"))
            .collect();
        let mut l: Vec<(&str, &str)> = vec![("namespace", p.ns), ("pod", &p.name), ("uid", &p.uid)];
        l.extend(
            keys.iter()
                .zip(&p.annotations)
                .map(|(k, (_, v))| (k.as_str(), v.as_str())),
        );
        o.series(&labels(&l), pod_range(p), one);
    }
    o.family(
        "kube_pod_container_resource_requests",
        "The number of requested request resource by a container. It is recommended to use the kube_pod_resource_requests metric exposed by kube-scheduler instead, as it is more precise.",
    );
    for p in &w.pods {
        let mut l: Vec<(&str, &str)> = vec![
            ("namespace", p.ns),
            ("pod", &p.name),
            ("uid", &p.uid),
            ("container", p.container),
        ];
        if let Some(n) = p.node {
            l.push(("node", w.nodes[n].name));
        }
        l.extend([("resource", p.resource), ("unit", "integer")]);
        o.series(&labels(&l), pod_range(p), |_| Some(p.gpus.to_string()));
    }
    o.family(
        "kube_pod_container_status_waiting_reason",
        "Describes the reason the container is currently in waiting state.",
    );
    for p in &w.pods {
        if let Some(reason) = p.waiting {
            let l = labels(&[
                ("namespace", p.ns),
                ("pod", &p.name),
                ("uid", &p.uid),
                ("container", p.container),
                ("reason", reason),
            ]);
            o.series(&l, pod_range(p), one);
        }
    }
    o.family("kube_pod_status_phase", "The pods current phase.");
    for p in &w.pods {
        let l = labels(&[
            ("namespace", p.ns),
            ("pod", &p.name),
            ("uid", &p.uid),
            ("phase", p.phase),
        ]);
        o.series(&l, pod_range(p), one);
    }
    o.family(
        "kube_namespace_labels",
        "Kubernetes labels converted to Prometheus labels.",
    );
    for (ns, tier) in [
        ("inference", Some("production")),
        ("ml-platform", None),
        ("research", Some("research")),
        ("training", Some("research")),
    ] {
        let mut l = vec![("namespace", ns)];
        if let Some(t) = tier {
            l.push(("label_gpu_tier", t));
        }
        o.series(&labels(&l), all.clone(), one);
    }
    o.text.push_str("# EOF\n");
    o
}

// ---------------------------------------------------------------------------------------
// Summary (stderr): per workload, when all its GPUs were below the threshold.

fn hhmm(minute: usize) -> String {
    format!("{:02}:{:02}", minute / 60, minute % 60)
}

fn summary(w: &World, o: &Out) {
    eprintln!("families:");
    for (name, series, samples) in &o.family_series {
        eprintln!("  {name:<42} {series:>4} series {samples:>7} samples");
    }
    eprintln!("total: {} series, {} samples", o.series, o.samples);
    eprintln!(
        "workloads (idle = every GPU below {THRESHOLD}; runs of at least 30 min, `?` = has no samples):"
    );
    for (i, wl) in w.workloads.iter().enumerate() {
        let gpus: Vec<&Gpu> = w
            .gpus
            .iter()
            .filter(|g| g.pod.is_some_and(|p| w.pods[p].workload == i))
            .collect();
        let mut runs = Vec::new();
        let mut run_start: Option<usize> = None;
        let mut missing_in_run = false;
        let first = gpus.iter().map(|g| g.start).min().unwrap_or(0);
        for m in first..=STEPS {
            let state = if m == STEPS {
                None
            } else {
                let present: Vec<f64> = gpus
                    .iter()
                    .filter_map(|g| g.samples[m].map(|s| s.act))
                    .collect();
                if present.is_empty() {
                    Some((true, true))
                } else {
                    Some((present.iter().all(|a| *a < THRESHOLD), false))
                }
            };
            match (state, run_start) {
                (Some((true, missing)), None) => {
                    run_start = Some(m);
                    missing_in_run = missing;
                }
                (Some((true, missing)), Some(_)) => missing_in_run |= missing,
                (_, Some(s)) => {
                    if m - s >= 30 {
                        runs.push(format!(
                            "{}–{}{}",
                            hhmm(s),
                            hhmm(m),
                            if missing_in_run { "?" } else { "" }
                        ));
                    }
                    run_start = None;
                }
                _ => {}
            }
        }
        let shown = if gpus.is_empty() {
            "no DCGM series".to_string()
        } else {
            runs.join(", ")
        };
        eprintln!(
            "  {:<12} {:<11} {:<24} {:>2} GPU  {:<44} idle: {}",
            wl.ns, wl.kind, wl.name, wl.gpus, wl.scenario, shown
        );
    }
}

fn main() {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        eprintln!("usage: make_sample_trace OUT.om.gz | OUT.om | -");
        std::process::exit(2);
    });
    let world = build();
    let out = render(&world);
    summary(&world, &out);
    let bytes = out.text.as_bytes();
    if path == "-" {
        std::io::stdout().write_all(bytes).expect("write stdout");
    } else if path.ends_with(".gz") {
        let file = std::fs::File::create(&path).unwrap_or_else(|e| panic!("create {path}: {e}"));
        let mut gzip = Command::new("gzip")
            .args(["-9", "-n", "-c"])
            .stdin(Stdio::piped())
            .stdout(file)
            .spawn()
            .expect("run gzip -9 -n (is gzip installed?)");
        gzip.stdin
            .take()
            .expect("gzip stdin")
            .write_all(bytes)
            .expect("write to gzip");
        let status = gzip.wait().expect("wait for gzip");
        assert!(status.success(), "gzip failed: {status}");
    } else {
        std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("write {path}: {e}"));
    }
    eprintln!("wrote {path} ({} bytes uncompressed)", bytes.len());
}
