//! Writes a large synthetic DCGM trace for measuring backtest speed and memory:
//! `cargo run --release --example synth_trace -- GPUS HOURS STEP_SECONDS > big.om`.
//! Four GPUs per pod, one pod per Job; each pod busy for 90 minutes in every 270.

use std::io::{BufWriter, Write};

fn main() -> std::io::Result<()> {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numbers: GPUS HOURS STEP_SECONDS"))
        .collect();
    let (gpus, hours, step) = match args[..] {
        [g, h, s] => (g, h, s),
        _ => (1000, 24, 30),
    };
    let t0 = 1_793_577_600u64;
    let steps = hours * 3600 / step;
    let mut out = BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
    for (metric, kind) in [
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0),
        ("DCGM_FI_DEV_FB_USED", 1),
    ] {
        writeln!(out, "# TYPE {metric} gauge")?;
        for g in 0..gpus {
            let pod = g / 4;
            for k in 0..steps {
                let minute = k * step / 60;
                let busy = (minute / 90 + pod) % 3 == 0;
                let value = match (kind, busy) {
                    (1, _) => 30_000.0,
                    (_, true) => 0.6,
                    _ => 0.0,
                };
                writeln!(
                    out,
                    "{metric}{{gpu=\"{}\",UUID=\"GPU-{g:08}\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-{}\",namespace=\"team\",pod=\"job-{pod}-0\",container=\"main\"}} {value} {}",
                    g % 8,
                    g / 8,
                    t0 + k * step
                )?;
            }
        }
    }
    for (metric, extra, value) in [
        (
            "kube_pod_owner",
            ",owner_kind=\"Job\",owner_name=\"job-POD\",owner_is_controller=\"true\"",
            1.0,
        ),
        (
            "kube_pod_container_resource_requests",
            ",container=\"main\",resource=\"nvidia_com_gpu\",unit=\"integer\"",
            4.0,
        ),
    ] {
        writeln!(out, "# TYPE {metric} gauge")?;
        for pod in 0..gpus.div_ceil(4) {
            let extra = extra.replace("POD", &pod.to_string());
            for k in (0..steps).step_by((60 / step).max(1) as usize) {
                writeln!(
                    out,
                    "{metric}{{namespace=\"team\",pod=\"job-{pod}-0\"{extra}}} {value} {}",
                    t0 + k * step
                )?;
            }
        }
    }
    writeln!(out, "# EOF")?;
    out.flush()
}
