//! Worker tasks as pve-common's RESTEnvironment fork_worker runs them: the
//! task is registered under its UPID at once, its work runs after the
//! configured task latency, and its log ends in `TASK OK` or the error.

use std::sync::Arc;
use std::time::Duration;

use crate::ctx::Ctx;
use crate::tasks::Task;

/// Runs `work` as a task after the configured task latency. The returned
/// receiver yields its outcome (for `background_delay`).
pub fn spawn_task<F, Fut>(
    ctx: Arc<Ctx>,
    task: Task,
    work: F,
) -> tokio::sync::oneshot::Receiver<Result<(), String>>
where
    F: FnOnce(Arc<Ctx>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<Vec<String>, String>> + Send + 'static,
{
    let upid = task.upid.clone();
    ctx.cluster().tasks.insert(upid.clone(), task);
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let latency = ctx.cluster().knobs.task_latency_ms;
        if latency > 0 {
            tokio::time::sleep(Duration::from_millis(latency)).await;
        }
        let injected = {
            let mut c = ctx.cluster();
            let injected = crate::knobs::take(&mut c.knobs.fail_tasks);
            c.faults.failed_tasks += u64::from(injected);
            injected
        };
        let result = if injected {
            Err("task failed (injected by pvesim)".to_string())
        } else {
            let result = work(ctx.clone()).await;
            let mut c = ctx.cluster();
            if result.is_ok() && crate::knobs::take(&mut c.knobs.fail_tasks_after_work) {
                c.faults.failed_tasks_after_work += 1;
                Err("task failed after its work (injected by pvesim)".to_string())
            } else {
                result
            }
        };
        let mut c = ctx.cluster();
        if let Some(t) = c.tasks.get_mut(&upid) {
            let outcome = result.map(|log| t.log.extend(log));
            t.finish(outcome.clone());
            let _ = tx.send(outcome.map_err(|_| t.exitstatus.clone().unwrap_or_default()));
        }
    });
    rx
}
