//! Warnings to owners: email against a real SMTP server (aiosmtpd), Slack against a local
//! Web API stand-in, and both end to end on the real control plane.

#[path = "../common/mod.rs"]
mod common;

mod notify_e2e;
mod notify_email;
mod notify_slack;
