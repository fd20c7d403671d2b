//! `POST /access/ticket`: password login, answering a ticket and a CSRF token.

use serde_json::{Value, json};

use crate::api::Params;
use crate::reply::ApiError;
use crate::server::Ctx;

pub fn ticket(ctx: &Ctx, params: &Params) -> Result<Value, ApiError> {
    let (Some(user), Some(password)) = (params.get("username"), params.get("password")) else {
        return Err(ApiError::param(
            "username",
            "property is missing and it is not optional",
        ));
    };
    let userid = match params.get("realm") {
        Some(realm) if !user.contains('@') => format!("{user}@{realm}"),
        _ => user.to_string(),
    };
    let state = ctx.state.lock().map_err(|_| ApiError::die("state poisoned"))?;
    if !state.password_ok(&userid, password) {
        return Err(ApiError::new(401, "authentication failure"));
    }
    let cluster = state.cluster.clone();
    drop(state);
    let (ticket, csrf) = ctx
        .tickets
        .lock()
        .map_err(|_| ApiError::die("state poisoned"))?
        .issue(&userid);
    Ok(json!({
        "username": userid,
        "ticket": ticket,
        "CSRFPreventionToken": csrf,
        "clustername": cluster,
        "cap": {},
    }))
}
