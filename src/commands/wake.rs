//! `gpu-reaper wake <namespace>/<kind>/<name>`: the CLI edge of `actions::wake`.

use kube::Client;

use super::actions::{self, Outcome, api_for};
use super::inventory::ObjectInfo;
use crate::cli::WakeArgs;
use crate::commands::block_on;
use crate::{Error, Result};

/// The API version of a built-in kind gpu-reaper acts on.
pub fn builtin_api_version(kind: &str) -> Option<&'static str> {
    match kind {
        "Deployment" | "StatefulSet" | "ReplicaSet" => Some("apps/v1"),
        "Job" => Some("batch/v1"),
        "Pod" => Some("v1"),
        _ => None,
    }
}

/// The API version to address `kind` with: the one given (`--api-version`), else the
/// built-in kind's; `None` when neither says (the caller names the flag).
pub fn api_version_for(kind: &str, given: Option<&String>) -> Option<String> {
    given
        .cloned()
        .or_else(|| builtin_api_version(kind).map(str::to_string))
}

/// Splits `<namespace>/<kind>/<name>`.
pub fn parse_workload(text: &str) -> Result<(String, String, String)> {
    let parts: Vec<&str> = text.split('/').collect();
    match parts.as_slice() {
        [ns, kind, name] if !ns.is_empty() && !kind.is_empty() && !name.is_empty() => {
            Ok((ns.to_string(), kind.to_string(), name.to_string()))
        }
        _ => Err(Error::InvalidArgument {
            flag: "workload",
            message: format!(
                "{text:?} is not <namespace>/<kind>/<name>, e.g. ml/Deployment/llama-chat"
            ),
        }),
    }
}

pub fn run(args: &WakeArgs) -> Result<()> {
    let (namespace, kind, name) = parse_workload(&args.workload)?;
    let Some(api_version) = api_version_for(&kind, args.api_version.as_ref()) else {
        return Err(Error::InvalidArgument {
            flag: "api-version",
            message: format!(
                "{kind} is not a built-in kind; pass its API version, e.g. --api-version kubeflow.org/v1"
            ),
        });
    };
    let line = block_on(async {
        let client = Client::try_default().await.map_err(|source| Error::Kube {
            action: "connecting to the Kubernetes API (KUBECONFIG or in-cluster config)".into(),
            source,
        })?;
        let probe = ObjectInfo {
            api_version,
            kind: kind.clone(),
            namespace: namespace.clone(),
            name: name.clone(),
            uid: String::new(),
            owner: None,
            labels: Default::default(),
            annotations: Default::default(),
            created_at: jiff::Timestamp::UNIX_EPOCH,
            deleting: false,
        };
        let object = api_for(&client, &probe)
            .get(&name)
            .await
            .map_err(|source| Error::Kube {
                action: format!("reading {namespace}/{kind}/{name}"),
                source,
            })?;
        let value = serde_json::to_value(&object)?;
        let mut root = ObjectInfo::from_value(&value).unwrap_or(probe);
        root.api_version = value["apiVersion"]
            .as_str()
            .unwrap_or(&root.api_version)
            .to_string();
        match actions::wake(&client, &root, jiff::Timestamp::now()).await {
            Ok(
                Outcome::Done(s)
                | Outcome::AlreadyDone(s)
                | Outcome::Refused(s)
                | Outcome::Unsupported(s),
            ) => Ok(s),
            Err(e) => Err(Error::Kube {
                action: e.action,
                source: e.source,
            }),
        }
    })??;
    println!("{line}");
    Ok(())
}
