//! Who is calling: an API token (`PVEAPIToken=user@realm!id=secret`) or a
//! ticket cookie from `POST /access/ticket` (plus the CSRF header on writes).

use std::collections::HashMap;

use axum::http::{HeaderMap, Method};

use crate::reply::ApiError;
use crate::state::Cluster;

/// The authenticated identity: `user@realm` or `user@realm!token`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller(pub String);

impl Caller {
    pub fn is_token(&self) -> bool {
        self.0.contains('!')
    }
}

#[derive(Debug, Default)]
pub struct Tickets {
    // ticket -> (userid, csrf token, when issued)
    issued: HashMap<String, (String, String, std::time::Instant)>,
    counter: u64,
}

impl Tickets {
    pub fn issue(&mut self, userid: &str) -> (String, String) {
        self.counter += 1;
        let ticket = format!("PVE:{userid}:{:08X}::simsig{}", self.counter, self.counter);
        let csrf = format!("{:08X}:simcsrf{}", self.counter, self.counter);
        self.issued.insert(
            ticket.clone(),
            (userid.to_string(), csrf.clone(), std::time::Instant::now()),
        );
        (ticket, csrf)
    }
}

fn unauthorized(msg: &str) -> ApiError {
    ApiError::new(401, msg)
}

pub fn authenticate(
    state: &Cluster,
    tickets: &Tickets,
    method: &Method,
    headers: &HeaderMap,
) -> Result<Caller, ApiError> {
    if let Some(value) = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        && let Some(rest) = value.trim().strip_prefix("PVEAPIToken")
    {
        let rest = rest.trim_start_matches([' ', '=']);
        let rest = rest.split(';').next().unwrap_or_default();
        // Split on the last '=': the token id may not contain one, the secret is a uuid.
        let Some((tokenid, secret)) = rest.rsplit_once('=') else {
            return Err(unauthorized("Authentication failed!"));
        };
        return state
            .token_identity(tokenid, secret)
            .map(Caller)
            .ok_or_else(|| unauthorized("Authentication failed!"));
    }
    let cookie = headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| kv.trim().strip_prefix("PVEAuthCookie=").map(str::to_string));
    let Some(ticket) = cookie else {
        return Err(unauthorized("No ticket"));
    };
    // A ticket older than its lifetime is refused as a forged one is
    // (pve-access-control AccessControl.pm verify_ticket: `$ticket_lifetime`,
    // 2 hours; PVE::Ticket verify_rsa_ticket).
    let lifetime = std::time::Duration::from_millis(state.knobs.ticket_lifetime_ms);
    let Some((userid, csrf, _)) = tickets
        .issued
        .get(&ticket)
        .filter(|(_, _, issued)| issued.elapsed() < lifetime)
    else {
        return Err(unauthorized("authentication failure"));
    };
    if *method != Method::GET {
        let sent = headers
            .get("CSRFPreventionToken")
            .and_then(|v| v.to_str().ok());
        if sent != Some(csrf.as_str()) {
            return Err(unauthorized("Permission denied - invalid csrf token"));
        }
    }
    Ok(Caller(userid.clone()))
}
