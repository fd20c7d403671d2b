//! `GET /version`: any authenticated caller.

use serde_json::{Value, json};

use crate::auth::Caller;
use crate::reply::ApiError;
use crate::server::Ctx;

pub fn get(ctx: &Ctx, _: &Caller) -> Result<Value, ApiError> {
    let state = ctx.state.lock().map_err(|_| ApiError::die("state poisoned"))?;
    let release = state
        .version
        .rsplit_once('.')
        .map(|(r, _)| r.to_string())
        .unwrap_or_else(|| state.version.clone());
    Ok(json!({
        "version": state.version,
        "release": release,
        "repoid": "5e7ce3d2b0f0c9a4",
    }))
}
