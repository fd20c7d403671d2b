//! Task status and log; a caller sees its own tasks, or any with Sys.Audit.

use std::sync::Arc;

use serde_json::{Value, json};

use super::Call;
use crate::ctx::Ctx;
use crate::reply::ApiError;
use crate::state::Cluster;
use crate::tasks::{Task, parse_upid};

fn find<'a>(c: &'a Cluster, call: &Call) -> Result<&'a Task, ApiError> {
    let upid = call.req("upid")?;
    let node = call.req("node")?;
    if parse_upid(upid).is_none() {
        return Err(ApiError::param("upid", "unable to parse worker upid"));
    }
    let task = c
        .tasks
        .get(upid)
        .filter(|t| t.node == node)
        .ok_or_else(|| ApiError::param("upid", "no such task"))?;
    // A token sees its own tasks; its user sees the user's and the token's.
    let owner =
        task.user == call.caller || task.user.split('!').next() == Some(call.caller.as_str());
    if !owner && !c.has_priv(&call.caller, &format!("/nodes/{node}"), "Sys.Audit") {
        return Err(ApiError::forbidden(&format!("/nodes/{node}"), "Sys.Audit"));
    }
    Ok(task)
}

pub async fn status(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    Ok(find(&c, &call)?.status_json())
}

pub async fn log(ctx: Arc<Ctx>, call: Call) -> Result<Value, ApiError> {
    let c = ctx.cluster();
    let task = find(&c, &call)?;
    let start: usize = call.get("start").and_then(|s| s.parse().ok()).unwrap_or(0);
    let limit: usize = call.get("limit").and_then(|s| s.parse().ok()).unwrap_or(50);
    let lines: Vec<Value> = if task.log.is_empty() {
        vec![json!({"n": 1, "t": "no content"})]
    } else {
        task.log
            .iter()
            .enumerate()
            .skip(start)
            .take(if limit == 0 { usize::MAX } else { limit })
            .map(|(i, t)| json!({"n": i + 1, "t": t}))
            .collect()
    };
    Ok(Value::Array(lines))
}
