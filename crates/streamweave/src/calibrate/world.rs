//! The ranks of a [`World`]: one persistent thread per GPU of this process that runs jobs
//! together, each job's replies collected within a limit, and a world whose job failed or
//! did not reply in time stopped rather than reused.

use super::*;

type Reply = (usize, Result<Box<dyn Any + Send>, JobError>);
type Job = Arc<dyn Fn(&Rank) -> Result<Box<dyn Any + Send>, JobError> + Send + Sync>;

/// Ranks on the GPUs of this process, one persistent thread each, that run jobs together.
pub struct World {
    jobs: Vec<mpsc::Sender<Job>>,
    replies: mpsc::Receiver<Reply>,
    threads: Vec<JoinHandle<()>>,
    barrier: Arc<Barrier>,
    options: WorldOptions,
    failed: AtomicBool,
    /// Whether a job's limit passed before every rank replied ([`World::stuck`]).
    stuck: AtomicBool,
}

impl World {
    /// Opens the ranks' GPUs ([`WorldOptions::devices`], else `0..ranks`), a backend and an
    /// NCCL communicator on each.
    pub fn open(options: WorldOptions) -> Result<World, JobError> {
        if !options.devices.is_empty() && options.devices.len() != options.ranks {
            return Err(JobError(format!(
                "{} GPU(s) were given for {} rank(s)",
                options.devices.len(),
                options.ranks
            )));
        }
        let needed = options
            .devices
            .iter()
            .map(|d| d.saturating_add(1))
            .max()
            .unwrap_or(options.ranks);
        crate::world::gpus_available(needed).map_err(err("GPUs"))?;
        let id = NcclId::new().map_err(err("NCCL id"))?;
        let barrier = Arc::new(Barrier::new(options.ranks));
        let (reply_tx, replies) = mpsc::channel::<Reply>();
        let mut jobs = Vec::new();
        let mut threads = Vec::new();
        for rank in 0..options.ranks {
            let (tx, rx) = mpsc::channel::<Job>();
            jobs.push(tx);
            let reply = reply_tx.clone();
            let barrier = barrier.clone();
            let options = options.clone();
            threads.push(std::thread::spawn(move || {
                let open = || -> Result<Rank, JobError> {
                    let nccl = NcclOptions {
                        timeout: options.timeout,
                        ..options.nccl.clone()
                    };
                    let device = options.devices.get(rank).copied().unwrap_or(rank);
                    let crate::world::OpenRank { gpu, comm } =
                        crate::world::open_rank(device, rank, options.ranks, &id, nccl).map_err(
                            |e| match e {
                                crate::world::OpenError::Gpu(e) => format!("GPU: {e}"),
                                crate::world::OpenError::Nccl(e) => format!("NCCL: {e}"),
                            },
                        )?;
                    let cuda = CudaOptions {
                        timeout: options.timeout,
                        ..CudaOptions::default()
                    };
                    let backend = backend_for(&gpu, cuda, &comm).map_err(err("backend"))?;
                    Ok(Rank {
                        rank,
                        world: options.ranks,
                        gpu,
                        backend,
                        comm,
                        barrier,
                        timeout: options.timeout,
                    })
                };
                let me = match open() {
                    Ok(me) => {
                        let _ = reply.send((rank, Ok(Box::new(()))));
                        me
                    }
                    Err(e) => {
                        let _ = reply.send((rank, Err(e)));
                        return;
                    }
                };
                while let Ok(job) = rx.recv() {
                    let r = job(&me);
                    if let Err(e) = &r {
                        me.barrier.break_with(&format!("rank {rank}: {e}"));
                        me.comm.abort(&e.0);
                    }
                    if reply.send((rank, r)).is_err() {
                        return;
                    }
                }
            }));
        }
        let world = World {
            jobs,
            replies,
            threads,
            barrier,
            options,
            failed: AtomicBool::new(false),
            stuck: AtomicBool::new(false),
        };
        world.collect::<()>(Duration::from_secs(120))?;
        Ok(world)
    }

    /// The number of ranks.
    pub fn ranks(&self) -> usize {
        self.options.ranks
    }

    fn collect<R: 'static>(&self, limit: Duration) -> Result<Vec<R>, JobError> {
        let mut out: Vec<Option<R>> = (0..self.options.ranks).map(|_| None).collect();
        let mut errors = Vec::new();
        // A limit past the end of time has no deadline.
        let deadline = Instant::now().checked_add(limit);
        let mut replied = vec![false; self.options.ranks];
        for _ in 0..self.options.ranks {
            let left = deadline.map_or(limit, |d| d.saturating_duration_since(Instant::now()));
            match self.replies.recv_timeout(left) {
                Ok((rank, reply)) if rank < replied.len() => {
                    replied[rank] = true;
                    match reply {
                        Ok(v) => match v.downcast::<R>() {
                            Ok(v) => out[rank] = Some(*v),
                            Err(_) => {
                                errors.push(format!("rank {rank}: a reply of the wrong type"))
                            }
                        },
                        Err(e) => errors.push(format!("rank {rank}: {e}")),
                    }
                }
                Ok((rank, _)) => errors.push(format!("a reply from rank {rank}, not in the world")),
                Err(_) => {
                    let silent: Vec<String> = (0..self.options.ranks)
                        .filter(|&r| !replied[r])
                        .map(|r| r.to_string())
                        .collect();
                    errors.push(format!(
                        "no reply from rank(s) {} within {:.0?}",
                        silent.join(", "),
                        limit
                    ));
                    self.stuck.store(true, Ordering::SeqCst);
                    self.barrier.break_with("a rank did not reply in time");
                    break;
                }
            }
        }
        if !errors.is_empty() {
            errors.sort();
            return Err(JobError(errors.join("; ")));
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// Runs `job` on every rank and returns the results by rank, or every rank's error: a
    /// job runs many timed iterations, each wait bounded by the timeout, so one that takes
    /// longer than four timeouts is stuck ([`World::run_within`] with that limit).
    pub fn run<R: Send + 'static>(
        &self,
        job: impl Fn(&Rank) -> Result<R, JobError> + Send + Sync + 'static,
    ) -> Result<Vec<R>, JobError> {
        self.run_within(job, self.options.timeout.saturating_mul(4))
    }

    /// [`World::run`] waiting at most `limit` for the ranks' replies: a rank that has not
    /// replied by then fails the job and marks the world [`stuck`](World::stuck). A world
    /// that failed runs nothing more (its communicator may be aborted, and a late reply of
    /// the failed job would be taken for the next one's): this fails at once, saying why.
    pub fn run_within<R: Send + 'static>(
        &self,
        job: impl Fn(&Rank) -> Result<R, JobError> + Send + Sync + 'static,
        limit: Duration,
    ) -> Result<Vec<R>, JobError> {
        if self.failed() {
            return Err(JobError(if self.stuck() {
                "not run: a rank of an earlier job did not reply in time and may still hold \
                 its GPU (only the end of this process frees it)"
                    .to_string()
            } else {
                "not run: an earlier job failed and stopped this world (open another)".to_string()
            }));
        }
        let job: Job =
            Arc::new(move |rank: &Rank| job(rank).map(|r| Box::new(r) as Box<dyn Any + Send>));
        for tx in &self.jobs {
            tx.send(job.clone())
                .map_err(|_| "a rank's thread has ended".to_string())?;
        }
        let r = self.collect(limit);
        if r.is_err() {
            self.failed.store(true, Ordering::SeqCst);
        }
        r
    }

    /// Whether a job failed: the communicator may have been aborted and threads may be stuck,
    /// so the world should be dropped (its threads are then left, not joined) and reopened.
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// Whether a job's limit passed before every rank replied: that rank's thread may still
    /// wait on GPU work no timeout of it bounds, so the GPUs of this world may not run other
    /// work until the process ends.
    pub fn stuck(&self) -> bool {
        self.stuck.load(Ordering::SeqCst)
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.jobs.clear();
        if self.failed() {
            // A rank may still be stuck in GPU work (one that did not reply, or one whose wait
            // timed out while its stream still waits): joining, or freeing its GPU memory,
            // could wait forever. Its threads are left, counted, for the end of the process.
            crate::threads::left_behind(self.threads.len());
            self.threads.clear();
            return;
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
