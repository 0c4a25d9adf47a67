//! `gpu-reaper wake <namespace>/<kind>/<name>`: the CLI edge of `actions::wake`.

use kube::Client;

use super::block_on;
use crate::cli::WakeArgs;
use crate::cluster::actions::{self, Outcome, api_for};
use crate::cluster::address::{api_version_for, parse_workload};
use crate::cluster::inventory::ObjectInfo;
use crate::{Error, Result};

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
