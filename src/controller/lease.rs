//! Leader election on a coordination.k8s.io/v1 Lease: only the holder acts. A standby
//! takes the Lease once the holder has not renewed it for `leaseDurationSeconds`.
//! Every write carries the resourceVersion it read, so two candidates cannot both win.
//! A leader that stops (SIGTERM) releases the Lease ([`Elector::release`]): a standby takes
//! it at its next attempt, not a lease duration later.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::{Api, Client};

/// One candidate for the Lease.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: SignedDuration,
}

impl Elector {
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        duration: SignedDuration,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity: identity.to_string(),
            duration,
        }
    }

    /// Acquires or renews the Lease; `Ok(true)` while this candidate leads.
    pub async fn try_lead(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let seconds = self.duration.as_secs().max(1) as i32;
        let spec = |transitions: i32, acquired: Timestamp| LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(seconds),
            acquire_time: Some(MicroTime(acquired)),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        };
        let current = match self.api.get_opt(&self.name).await? {
            Some(l) => l,
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec(0, now)),
                };
                return match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                    Err(e) => Err(e),
                };
            }
        };
        let held = current.spec.clone().unwrap_or_default();
        let mine = held.holder_identity.as_deref() == Some(self.identity.as_str());
        let expired = held.renew_time.as_ref().is_none_or(|t| {
            let lasts =
                SignedDuration::from_secs(held.lease_duration_seconds.unwrap_or(seconds) as i64);
            t.0 + lasts < now
        });
        if !mine && !expired {
            return Ok(false);
        }
        let transitions = held.lease_transitions.unwrap_or(0) + i32::from(!mine);
        let acquired = if mine {
            held.acquire_time.map_or(now, |t| t.0)
        } else {
            now
        };
        self.write(current, spec(transitions, acquired)).await
    }

    /// Replaces the Lease read as `current` with `spec`: `Ok(false)` when someone wrote it
    /// since (its resourceVersion moved on), so two candidates cannot both win.
    async fn write(&self, current: Lease, spec: LeaseSpec) -> Result<bool, kube::Error> {
        let mut next = current;
        next.spec = Some(spec);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &next)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the Lease up if this candidate holds it: no holder, no renewal, so any
    /// standby's next [`Self::try_lead`] takes it. `Ok(false)` when it was not held here
    /// (nothing written).
    pub async fn release(&self) -> Result<bool, kube::Error> {
        let Some(current) = self.api.get_opt(&self.name).await? else {
            return Ok(false);
        };
        let mut spec = current.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(false);
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        // A conflict: someone wrote it since, and it is no longer ours to give.
        self.write(current, spec).await
    }
}
