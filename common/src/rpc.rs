//! One tracing span per RPC, and one log line for each RPC that fails, with
//! its method, the volume it concerns and the gRPC code: the handlers log
//! what they did, this logs what went wrong, so no failure goes unseen and
//! none is logged twice.

use std::future::Future;

use tonic::{Response, Status};
use tracing::Instrument;

/// Runs `handler` in a span named after the RPC; logs its failure once.
/// Client mistakes (invalid arguments, objects that do not exist, retries
/// of work under way) are logged at info, everything else at warn.
pub async fn traced<T, F>(
    method: &'static str,
    volume_id: &str,
    handler: F,
) -> Result<Response<T>, Status>
where
    F: Future<Output = Result<Response<T>, Status>>,
{
    let span = tracing::info_span!("rpc", method, volume_id);
    async move {
        let result = handler.await;
        if let Err(s) = &result {
            use tonic::Code::*;
            match s.code() {
                InvalidArgument | NotFound | AlreadyExists | Aborted | OutOfRange => {
                    tracing::info!(code = ?s.code(), error = s.message(), "RPC failed")
                }
                _ => tracing::warn!(code = ?s.code(), error = s.message(), "RPC failed"),
            }
        }
        result
    }
    .instrument(span)
    .await
}

/// Runs `handler` in the RPC's span only, for a service that logs each
/// outcome itself (hostd's audit line).
pub async fn in_span<T, F: Future<Output = T>>(
    method: &'static str,
    volume_id: &str,
    handler: F,
) -> T {
    handler
        .instrument(tracing::info_span!("rpc", method, volume_id))
        .await
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::Error::other("poisoned"))?
                .extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Buf {
        type Writer = Buf;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    #[tokio::test]
    async fn a_failed_rpc_is_logged_once_with_method_volume_and_code() {
        let buf = Buf::default();
        let sub = tracing_subscriber::fmt()
            .with_writer(buf.clone())
            .with_ansi(false)
            .finish();
        let _g = tracing::subscriber::set_default(sub);
        let r: Result<Response<()>, Status> =
            traced("CreateVolume", "r/z/s/vm-9999-pvc-1", async {
                Err(Status::internal("storage full"))
            })
            .await;
        assert!(r.is_err());
        let ok: Result<Response<()>, Status> = traced("DeleteVolume", "r/z/s/vm-1", async {
            Ok(Response::new(()))
        })
        .await;
        assert!(ok.is_ok());
        let out = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 1, "{out}");
        let l = lines[0];
        assert!(l.contains("WARN"), "{l}");
        assert!(
            l.contains("method=\"CreateVolume\"") || l.contains("method=CreateVolume"),
            "{l}"
        );
        assert!(l.contains("r/z/s/vm-9999-pvc-1"), "{l}");
        assert!(
            l.contains("code=Internal") && l.contains("storage full"),
            "{l}"
        );
    }
}
