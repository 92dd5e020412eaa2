//! The jobs runner's dispatch over two connection workers: jobs take the workers (and so
//! their upstream lanes) in turn, and no job builds a stack.

use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use tokio::sync::{mpsc, oneshot};
use tracing_subscriber::layer::SubscriberExt;

use super::super::workers::Job;
use super::super::{stack, Live, State};
use super::dispatch;
use crate::config::Config;
use crate::context::JobRun;
use crate::domain::TenantId;

/// Records the `worker` field of every request log line of its thread.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u64>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Lines {
    fn on_event(&self, e: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Worker(Option<u64>);
        impl tracing::field::Visit for Worker {
            fn record_u64(&mut self, f: &tracing::field::Field, v: u64) {
                if f.name() == "worker" {
                    self.0 = Some(v);
                }
            }
            fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
        }
        if e.metadata().target() == "fairgate::request" {
            let mut w = Worker(None);
            e.record(&mut w);
            self.0.lock().unwrap().extend(w.0);
        }
    }
}

/// A worker's job queue, its log lines, its stop and its thread.
type Worker = (
    mpsc::UnboundedSender<Job>,
    Lines,
    oneshot::Sender<()>,
    std::thread::JoinHandle<()>,
);

/// A connection worker as `server::workers` runs it (a current-thread runtime on a thread
/// marked with its `index`, spawning the jobs handed to it), logging into its own [`Lines`];
/// told to stop, it takes no more jobs and drains those it runs.
fn worker(index: usize) -> Worker {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let log = Lines::default();
    let (tx, mut jobs) = mpsc::unbounded_channel::<Job>();
    let (stop, mut stopped) = oneshot::channel::<()>();
    let lines = log.clone();
    let thread = std::thread::spawn(move || {
        crate::worker::set(index);
        let _log = tracing::subscriber::set_default(tracing_subscriber::registry().with(lines));
        rt.block_on(async move {
            let mut tasks = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    Some(job) = jobs.recv() => drop(tasks.spawn(job)),
                }
            }
            drop(jobs);
            while tasks.join_next().await.is_some() {}
        });
    });
    (tx, log, stop, thread)
}

/// What worker `w` answers `probe` with, run there.
async fn on<T: Send + 'static>(w: &Worker, probe: fn() -> T) -> T {
    let (tx, rx) = oneshot::channel();
    let job: Job = Box::pin(async move {
        let _ = tx.send(probe());
    });
    w.0.send(job).ok().unwrap();
    rx.await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_take_the_workers_lanes_in_turn_and_build_no_stack() {
    // No upstream is needed: `/v1/models` is answered by `route`, and every request's log line
    // (written by `metrics` when the body is done) says which worker served it.
    let db = std::env::temp_dir().join(format!("fg-dispatch-{:x}.sqlite", rand::random::<u64>()));
    let config = Config::from_toml_str(&format!(
        "[jobs]\npath = {db:?}\n\
         [[upstreams]]\nname = \"u\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmodels = [\"m\"]\n\
         [[tenants]]\nid = \"a\"\napi_keys = [\"k\"]\n"
    ))
    .unwrap();
    let live = Live::new(State::new(config).unwrap(), None);
    let workers = [worker(0), worker(1)];
    let run = dispatch(live.clone(), workers.iter().map(|w| w.0.clone()).collect());
    for _ in 0..6 {
        let job = JobRun {
            tenant: TenantId::new("a"),
            refused: Arc::new(OnceLock::new()),
        };
        let req = Request::get("/v1/models")
            .extension(job)
            .body(Full::new(Bytes::new()))
            .unwrap();
        let answer = run(req).await.expect("the workers run");
        assert_eq!(answer.status, 200, "{:?}", answer.body);
    }
    for (i, (_, log, _, _)) in workers.iter().enumerate() {
        assert_eq!(
            *log.0.lock().unwrap(),
            [i as u64; 3],
            "worker {i} served every other job, on its own lane"
        );
    }
    for (i, w) in workers.iter().enumerate() {
        assert_eq!(on(w, crate::worker::current).await, i);
        let built = on(w, stack::built_here).await;
        assert_eq!(
            built, 0,
            "a job builds no stack: the generation's is reused"
        );
    }
    // A stopped worker hands the job back unanswered.
    for (_, _, stop, thread) in workers {
        let _ = stop.send(());
        thread.join().unwrap();
    }
    let job = JobRun {
        tenant: TenantId::new("a"),
        refused: Arc::new(OnceLock::new()),
    };
    let req = Request::post("/v1/chat/completions")
        .extension(job)
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    assert!(run(req).await.is_none());
    let _ = std::fs::remove_file(&db);
}
