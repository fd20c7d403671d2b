//! `POST /access/ticket`: password login, answering a ticket and a CSRF token.

use serde_json::{Value, json};

use crate::ctx::Ctx;
use crate::reply::ApiError;
use std::collections::BTreeMap;

pub fn ticket(ctx: &Ctx, params: &BTreeMap<String, String>) -> Result<Value, ApiError> {
    let (Some(user), Some(password)) = (
        params.get("username").map(String::as_str),
        params.get("password").map(String::as_str),
    ) else {
        return Err(ApiError::param(
            "username",
            "property is missing and it is not optional",
        ));
    };
    let userid = match params.get("realm").map(String::as_str) {
        Some(realm) if !user.contains('@') => format!("{user}@{realm}"),
        _ => user.to_string(),
    };
    let cluster = {
        let c = ctx.cluster();
        if !c.password_ok(&userid, password) {
            return Err(ApiError::new(401, "authentication failure"));
        }
        c.name.clone()
    };
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
