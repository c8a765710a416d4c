//! `users-svc inbox show --key KEY`: what the inbox saved for one idempotency key (the
//! request's fingerprint, the answer every repeat gets, and when), for an operator
//! checking what Users did with a delivery.

use std::io::Write;

use chrono::SecondsFormat;
use sea_orm::{DatabaseConnection, EntityTrait};

use crate::entity::inbox;

/// Prints the inbox entry of `key` as `name value` lines; `false` when there is none.
pub async fn show_inbox_entry(
    db: &DatabaseConnection,
    key: &str,
    out: &mut impl Write,
) -> anyhow::Result<bool> {
    let Some(entry) = inbox::Entity::find_by_id(key.to_owned()).one(db).await? else {
        return Ok(false);
    };
    writeln!(out, "idempotency_key {}", entry.idempotency_key)?;
    writeln!(out, "request_hash {}", entry.request_hash)?;
    writeln!(
        out,
        "created_at {}",
        entry
            .created_at
            .to_rfc3339_opts(SecondsFormat::Micros, true)
    )?;
    // The saved answer as stored: a user id, or a code, reason and message; never the
    // request's personal data, which the inbox does not keep.
    writeln!(out, "result {}", entry.result)?;
    Ok(true)
}
