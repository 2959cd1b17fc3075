//! Tests of the bootstrap layer: launcher variables (precedence, defaults, every error
//! message) and the TCP store (round trips between threads, late servers, timeouts), with
//! the NCCL id exchange and per-rank gathering built on it.

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use weave_comm::bootstrap::{
    all_gather, exchange_id, gather, LaunchEnv, TcpStore, DEFAULT_MASTER_PORT, MAX_KEY_BYTES,
};
use weave_comm::CommError;

const LONG: Duration = Duration::from_secs(20);

/// `LaunchEnv::from_lookup` over a fixed set of variables.
fn env(vars: &[(&str, &str)]) -> Result<Option<LaunchEnv>, CommError> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    LaunchEnv::from_lookup(|name| map.get(name).cloned())
}

fn parsed(vars: &[(&str, &str)]) -> LaunchEnv {
    env(vars).unwrap().expect("a launcher should be detected")
}

fn error(vars: &[(&str, &str)]) -> String {
    env(vars).unwrap_err().to_string()
}

#[test]
fn no_launcher_means_a_single_process() {
    assert_eq!(env(&[]).unwrap(), None);
    // The store address alone does not make a launch.
    assert_eq!(
        env(&[("MASTER_ADDR", "10.0.0.1"), ("MASTER_PORT", "1234")]).unwrap(),
        None
    );
}

#[test]
fn torchrun_variables() {
    let e = parsed(&[
        ("RANK", "5"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("MASTER_ADDR", "node0.cluster"),
        ("MASTER_PORT", "12345"),
    ]);
    assert_eq!(
        e,
        LaunchEnv {
            rank: 5,
            world: 8,
            local_rank: 1,
            local_world: 4,
            master_addr: "node0.cluster".into(),
            master_port: 12345,
            source: "torchrun",
            store_fd: None,
        }
    );
    assert_eq!(e.device(), 1);
    assert_eq!(e.store_addr(), "node0.cluster:12345");
}

/// torchrun's agent serves its store at MASTER_PORT (and sets TORCHELASTIC_USE_AGENT_STORE):
/// ours takes the next port, unless WEAVE_STORE_PORT names one; a bad one is named.
#[test]
fn the_store_steps_aside_for_torchruns_agent_store() {
    let torchrun = [
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_PORT", "29500"),
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
    ];
    assert_eq!(parsed(&torchrun).master_port, 29501);
    assert_eq!(parsed(&torchrun[..3]).master_port, 29500);
    let chosen = [torchrun.as_slice(), &[("WEAVE_STORE_PORT", "4100")]].concat();
    assert_eq!(parsed(&chosen).master_port, 4100);
    let last = [
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_PORT", "65535"),
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
    ];
    let e = error(&last);
    assert!(e.contains("set WEAVE_STORE_PORT"), "{e}");
    let bad = [torchrun.as_slice(), &[("WEAVE_STORE_PORT", "0")]].concat();
    let e = error(&bad);
    assert!(
        e.contains("WEAVE_STORE_PORT=0 is not a port number (1 to 65535)"),
        "{e}"
    );
}

#[test]
fn defaults_for_the_store_and_the_local_rank() {
    let e = parsed(&[("RANK", "2"), ("WORLD_SIZE", "4")]);
    assert_eq!(e.master_addr, "127.0.0.1");
    assert_eq!(e.master_port, DEFAULT_MASTER_PORT);
    assert_eq!(e.master_port, 29500);
    // No local variables: one node, the local rank is the rank.
    assert_eq!((e.local_rank, e.local_world), (2, 4));
    // A local world size alone: ranks fill nodes in blocks.
    let e = parsed(&[
        ("RANK", "5"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_WORLD_SIZE", "4"),
    ]);
    assert_eq!((e.local_rank, e.local_world), (1, 4));
    // Surrounding blanks are tolerated.
    let e = parsed(&[("RANK", " 1 "), ("WORLD_SIZE", "2\n")]);
    assert_eq!((e.rank, e.world), (1, 2));
}

#[test]
fn ipv6_store_addresses_are_bracketed() {
    let e = parsed(&[("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "::1")]);
    assert_eq!(e.store_addr(), "[::1]:29500");
}

#[test]
fn launcher_precedence() {
    let torchrun = [("RANK", "1"), ("WORLD_SIZE", "2")];
    let ompi = [
        ("OMPI_COMM_WORLD_RANK", "3"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
    ];
    let pmi = [
        ("PMI_RANK", "5"),
        ("PMI_SIZE", "6"),
        ("MPI_LOCALRANKID", "2"),
        ("MPI_LOCALNRANKS", "3"),
    ];
    let slurm = [
        ("SLURM_PROCID", "6"),
        ("SLURM_NTASKS", "8"),
        ("SLURM_LOCALID", "2"),
    ];
    let all: Vec<_> = torchrun
        .iter()
        .chain(&ompi)
        .chain(&pmi)
        .chain(&slurm)
        .copied()
        .collect();
    let e = parsed(&all);
    assert_eq!((e.source, e.rank, e.world), ("torchrun", 1, 2));

    let e = parsed(&all[torchrun.len()..]);
    assert_eq!(
        (e.source, e.rank, e.world, e.local_rank, e.local_world),
        ("Open MPI", 3, 4, 1, 2)
    );

    let e = parsed(&all[torchrun.len() + ompi.len()..]);
    assert_eq!(
        (e.source, e.rank, e.world, e.local_rank, e.local_world),
        ("PMI", 5, 6, 2, 3)
    );

    let e = parsed(&slurm);
    assert_eq!(
        (e.source, e.rank, e.world, e.local_rank, e.local_world),
        ("Slurm", 6, 8, 2, 8)
    );
    assert_eq!(e.device(), 2);

    // A malformed variable of a lower-precedence launcher does not matter.
    let e = parsed(&[("RANK", "0"), ("WORLD_SIZE", "1"), ("PMI_RANK", "zero")]);
    assert_eq!(e.source, "torchrun");
}

#[test]
fn every_error_names_the_variable_and_its_value() {
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (
            vec![("RANK", "abc"), ("WORLD_SIZE", "2")],
            "RANK=abc is not a number",
        ),
        (
            vec![("RANK", "-1"), ("WORLD_SIZE", "2")],
            "RANK=-1 is not a number",
        ),
        (vec![("RANK", "0")], "RANK is set but WORLD_SIZE is not"),
        (
            vec![("RANK", "0"), ("WORLD_SIZE", "two")],
            "WORLD_SIZE=two is not a number",
        ),
        (
            vec![("RANK", "0"), ("WORLD_SIZE", "0")],
            "WORLD_SIZE=0 must be at least 1",
        ),
        (
            vec![("RANK", "4"), ("WORLD_SIZE", "4")],
            "RANK=4 is not below WORLD_SIZE=4",
        ),
        (
            vec![("RANK", "0"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "x")],
            "LOCAL_RANK=x is not a number",
        ),
        (
            vec![
                ("RANK", "0"),
                ("WORLD_SIZE", "4"),
                ("LOCAL_RANK", "2"),
                ("LOCAL_WORLD_SIZE", "2"),
            ],
            "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2",
        ),
        (
            vec![("RANK", "0"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "4")],
            "LOCAL_RANK=4 is not below WORLD_SIZE=4",
        ),
        (
            vec![
                ("RANK", "0"),
                ("WORLD_SIZE", "4"),
                ("LOCAL_WORLD_SIZE", "8"),
            ],
            "LOCAL_WORLD_SIZE=8 is larger than WORLD_SIZE=4",
        ),
        (
            vec![
                ("RANK", "0"),
                ("WORLD_SIZE", "4"),
                ("LOCAL_WORLD_SIZE", "0"),
            ],
            "LOCAL_WORLD_SIZE=0 must be at least 1",
        ),
        (
            vec![("RANK", "0"), ("WORLD_SIZE", "4"), ("LOCAL_WORLD_SIZE", "")],
            "LOCAL_WORLD_SIZE= is not a number",
        ),
        (
            vec![("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_PORT", "99999")],
            "MASTER_PORT=99999 is not a port number (1 to 65535)",
        ),
        (
            vec![("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_PORT", "0")],
            "MASTER_PORT=0 is not a port number (1 to 65535)",
        ),
        (
            vec![("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_PORT", "http")],
            "MASTER_PORT=http is not a port number (1 to 65535)",
        ),
        (
            vec![("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", " ")],
            "MASTER_ADDR is set but empty",
        ),
        (
            vec![("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "x")],
            "OMPI_COMM_WORLD_SIZE=x is not a number",
        ),
        (
            vec![("OMPI_COMM_WORLD_RANK", "1")],
            "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not",
        ),
        (
            vec![
                ("OMPI_COMM_WORLD_RANK", "1"),
                ("OMPI_COMM_WORLD_SIZE", "4"),
                ("OMPI_COMM_WORLD_LOCAL_RANK", "3"),
                ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ],
            "OMPI_COMM_WORLD_LOCAL_RANK=3 is not below OMPI_COMM_WORLD_LOCAL_SIZE=2",
        ),
        (
            vec![("PMI_RANK", "2"), ("PMI_SIZE", "2")],
            "PMI_RANK=2 is not below PMI_SIZE=2",
        ),
        (
            vec![
                ("PMI_RANK", "0"),
                ("PMI_SIZE", "2"),
                ("MPI_LOCALRANKID", "?"),
            ],
            "MPI_LOCALRANKID=? is not a number",
        ),
        (
            vec![("SLURM_PROCID", "0")],
            "SLURM_PROCID is set but SLURM_NTASKS is not",
        ),
        (
            vec![
                ("SLURM_PROCID", "0"),
                ("SLURM_NTASKS", "4"),
                ("SLURM_LOCALID", "5"),
            ],
            "SLURM_LOCALID=5 is not below SLURM_NTASKS=4",
        ),
    ];
    for (vars, expected) in cases {
        assert_eq!(
            error(&vars),
            format!("bootstrap failed: {expected}"),
            "for {vars:?}"
        );
        assert!(matches!(env(&vars), Err(CommError::Bootstrap(_))));
    }
}

#[test]
fn the_launch_is_read_only_through_the_lookup() {
    // With nothing set, each launcher's rank variable is asked for, in order of precedence,
    // and nothing else (whatever this test process's own environment holds).
    let asked = std::cell::RefCell::new(Vec::new());
    let launch = LaunchEnv::from_lookup(|name| {
        asked.borrow_mut().push(name.to_string());
        None
    });
    assert_eq!(launch.unwrap(), None);
    assert_eq!(
        asked.into_inner(),
        ["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"]
    );
}

/// A port that nothing listens on (it was free a moment ago).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[test]
fn store_round_trip_between_four_threads() {
    let world = 4;
    let server = TcpStore::serve("127.0.0.1:0", world, LONG).unwrap();
    assert!(server.is_server());
    assert_eq!(server.world(), Some(world));
    let addr = server.local_addr().to_string();
    assert_ne!(server.local_addr().port(), 0);
    let server = Arc::new(server);
    let barrier = Arc::new(Barrier::new(world));
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let addr = addr.clone();
            let server = Arc::clone(&server);
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                let client;
                let store: &TcpStore = if rank == 0 {
                    &server
                } else {
                    client = TcpStore::connect(&addr, LONG).unwrap();
                    assert!(!client.is_server());
                    assert_eq!(client.local_addr(), server.local_addr());
                    &client
                };
                // Every rank publishes a value, then reads everyone's (waiting as needed).
                let value = vec![rank as u8; 1000 * (rank + 1)];
                store.set(&format!("value/{rank}"), &value).unwrap();
                for r in 0..world {
                    let got = store.get(&format!("value/{r}")).unwrap();
                    assert_eq!(got, vec![r as u8; 1000 * (r + 1)]);
                }
                // The NCCL id exchange: rank 0 makes it, everyone gets the same bytes.
                let id = exchange_id(store, rank, || Ok([42u8; 128])).unwrap();
                assert_eq!(id, vec![42u8; 128]);
                // Per-rank results are collected on rank 0 in rank order.
                let mine = format!("result of rank {rank}");
                let all = gather(store, rank, world, "results", mine.as_bytes()).unwrap();
                if rank == 0 {
                    let all = all.expect("rank 0 gathers");
                    let all: Vec<String> = all
                        .into_iter()
                        .map(|b| String::from_utf8(b).unwrap())
                        .collect();
                    assert_eq!(
                        all,
                        (0..world)
                            .map(|r| format!("result of rank {r}"))
                            .collect::<Vec<_>>()
                    );
                } else {
                    assert!(all.is_none());
                }
                // Keep the server alive until every rank is done with it.
                barrier.wait();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn values_are_replaced_and_may_be_empty_or_large() {
    let server = TcpStore::serve("127.0.0.1:0", 2, LONG).unwrap();
    let client = TcpStore::connect(&server.local_addr().to_string(), LONG).unwrap();
    client.set("k", b"first").unwrap();
    assert_eq!(server.get("k").unwrap(), b"first");
    server.set("k", b"second").unwrap();
    assert_eq!(client.get("k").unwrap(), b"second");
    client.set("empty", b"").unwrap();
    assert_eq!(client.get("empty").unwrap(), b"");
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    client.set("big", &big).unwrap();
    assert_eq!(client.get("big").unwrap(), big);
    assert_eq!(server.get("big").unwrap(), big);
    let long_key = "k".repeat(MAX_KEY_BYTES + 1);
    let e = client.set(&long_key, b"x").unwrap_err().to_string();
    assert!(e.contains("more than the limit of 4096"), "{e}");
    // The connection is still usable after a refused request.
    assert_eq!(client.get("k").unwrap(), b"second");
}

#[test]
fn a_client_may_start_before_the_server() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let client = {
        let addr = addr.clone();
        thread::spawn(move || {
            let store = TcpStore::connect(&addr, LONG)?;
            store.get("hello")
        })
    };
    thread::sleep(Duration::from_millis(400));
    let server = TcpStore::serve(&addr, 2, LONG).unwrap();
    server.set("hello", b"world").unwrap();
    assert_eq!(client.join().unwrap().unwrap(), b"world");
}

#[test]
fn a_get_that_times_out_names_the_key_and_the_store() {
    let timeout = Duration::from_millis(300);
    let server = TcpStore::serve("127.0.0.1:0", 2, timeout).unwrap();
    let addr = server.local_addr();

    let start = Instant::now();
    let e = server.get("never-set").unwrap_err();
    assert!(start.elapsed() >= timeout);
    assert_eq!(
        e.to_string(),
        format!(
            "bootstrap failed: timed out after 300 ms waiting for key \"never-set\" at the \
             store {addr}"
        )
    );

    let client = TcpStore::connect(&addr.to_string(), timeout).unwrap();
    let start = Instant::now();
    let e = client.get("nccl-id").unwrap_err();
    let waited = start.elapsed();
    assert!(
        waited >= timeout && waited < Duration::from_secs(10),
        "{waited:?}"
    );
    assert_eq!(
        e.to_string(),
        format!(
            "bootstrap failed: timed out after 300 ms waiting for key \"nccl-id\" at the \
             store {addr}"
        )
    );
    // The connection stays in step after a timed-out get.
    server.set("later", b"ok").unwrap();
    assert_eq!(client.get("later").unwrap(), b"ok");
    // A longer wait of its own.
    let e = client
        .get_timeout("other", Duration::from_millis(50))
        .unwrap_err();
    assert!(e.to_string().contains("after 50 ms"), "{e}");
}

#[test]
fn connecting_to_a_dead_address_times_out_naming_it() {
    let addr = format!("127.0.0.1:{}", free_port());
    let start = Instant::now();
    let e = TcpStore::connect(&addr, Duration::from_millis(300)).unwrap_err();
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(10),
        "{waited:?}"
    );
    let message = e.to_string();
    assert!(
        message.starts_with(&format!(
            "bootstrap failed: could not connect to the store at {addr} within 300 ms: "
        )),
        "{message}"
    );
    assert!(matches!(e, CommError::Bootstrap(_)));

    let e = TcpStore::connect("no-such-host.invalid:29500", Duration::from_millis(100))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no-such-host.invalid:29500"), "{e}");
}

#[test]
fn serving_on_a_taken_port_fails_naming_the_address() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let e = TcpStore::serve(&addr, 2, LONG).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!(
            "bootstrap failed: cannot serve the store on {addr}: "
        )),
        "{e}"
    );
}

#[test]
fn operations_fail_once_the_server_is_gone() {
    let server = TcpStore::serve("127.0.0.1:0", 2, LONG).unwrap();
    let addr = server.local_addr();
    let client = TcpStore::connect(&addr.to_string(), Duration::from_secs(5)).unwrap();
    client.set("a", b"1").unwrap();
    let waiting = thread::spawn(move || client.get("b"));
    thread::sleep(Duration::from_millis(200));
    drop(server);
    let e = waiting.join().unwrap().unwrap_err().to_string();
    assert!(e.contains("\"b\"") && e.contains(&addr.to_string()), "{e}");
}

#[test]
fn a_failed_id_reaches_the_other_ranks_at_once() {
    let server = TcpStore::serve("127.0.0.1:0", 2, LONG).unwrap();
    let addr = server.local_addr().to_string();
    let other = thread::spawn(move || {
        let store = TcpStore::connect(&addr, LONG).unwrap();
        exchange_id(&store, 1, || -> Result<Vec<u8>, CommError> {
            unreachable!("only rank 0 makes the id")
        })
    });
    let start = Instant::now();
    let e = exchange_id(&server, 0, || -> Result<Vec<u8>, CommError> {
        Err(CommError::Backend {
            op: "loading NCCL".into(),
            message: "libnccl.so is missing".into(),
        })
    })
    .unwrap_err();
    assert_eq!(e.to_string(), "loading NCCL failed: libnccl.so is missing");
    let e = other.join().unwrap().unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_eq!(
        e.to_string(),
        "bootstrap failed: rank 0 could not create the NCCL id: loading NCCL failed: \
         libnccl.so is missing"
    );
}

#[test]
fn gather_checks_the_rank() {
    let server = TcpStore::serve("127.0.0.1:0", 2, LONG).unwrap();
    let e = gather(&server, 2, 2, "x", b"").unwrap_err().to_string();
    assert_eq!(
        e,
        "bootstrap failed: gather of \"x\": rank 2 is outside a world of 2 ranks"
    );
    // A world of one gathers its own value.
    assert_eq!(
        gather(&server, 0, 1, "solo", b"me").unwrap(),
        Some(vec![b"me".to_vec()])
    );
}

#[test]
fn all_gather_gives_every_rank_every_value_in_rank_order() {
    let server = TcpStore::serve("127.0.0.1:0", 3, LONG).unwrap();
    let addr = server.local_addr().to_string();
    let others: Vec<_> = (1..3)
        .map(|rank| {
            let addr = addr.clone();
            thread::spawn(move || {
                let client = TcpStore::connect(&addr, LONG).unwrap();
                all_gather(&client, rank, 3, "cards", format!("card {rank}").as_bytes())
            })
        })
        .collect();
    let mine = all_gather(&server, 0, 3, "cards", b"card 0").unwrap();
    let want: Vec<Vec<u8>> = (0..3).map(|r| format!("card {r}").into_bytes()).collect();
    assert_eq!(mine, want);
    for h in others {
        assert_eq!(h.join().unwrap().unwrap(), want);
    }
    let e = all_gather(&server, 5, 3, "x", b"").unwrap_err().to_string();
    assert_eq!(
        e,
        "bootstrap failed: all-gather of \"x\": rank 5 is outside a world of 3 ranks"
    );
}

#[test]
fn open_store_serves_on_rank_0_and_connects_elsewhere() {
    let port = free_port();
    let launch = |rank| LaunchEnv {
        rank,
        world: 2,
        local_rank: rank,
        local_world: 2,
        master_addr: "127.0.0.1".into(),
        master_port: port,
        source: "torchrun",
        store_fd: None,
    };
    let server = launch(0).open_store(LONG).unwrap();
    assert!(server.is_server());
    let client = launch(1).open_store(LONG).unwrap();
    assert!(!client.is_server());
    client.set("x", b"y").unwrap();
    assert_eq!(server.get("x").unwrap(), b"y");
}

/// A launcher that binds port 0 hands rank 0 the listening socket (`WEAVE_STORE_FD`) and
/// publishes its port as `MASTER_PORT`: rank 0 serves on that very socket (never binding the
/// port again, so nothing can take it in between), and can do so for one store after another.
#[cfg(unix)]
#[test]
fn rank_0_serves_on_the_socket_its_launcher_bound() {
    use std::os::fd::IntoRawFd;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // The descriptor now belongs to "rank 0", as an inherited one would.
    let fd = listener.into_raw_fd().to_string();
    let port_s = port.to_string();
    let vars = |rank: &'static str| {
        vec![
            ("RANK", rank),
            ("WORLD_SIZE", "2"),
            ("MASTER_PORT", port_s.as_str()),
            ("WEAVE_STORE_FD", fd.as_str()),
        ]
    };
    let rank0 = parsed(&vars("0"));
    assert_eq!(rank0.store_fd, Some(fd.parse().unwrap()));
    // Only rank 0 serves: the variable means nothing elsewhere.
    let rank1 = parsed(&vars("1"));
    assert_eq!(rank1.store_fd, None);
    for round in 0..2 {
        let server = rank0.open_store(LONG).unwrap();
        assert!(server.is_server());
        assert_eq!(server.local_addr().port(), port);
        let client = rank1.open_store(LONG).unwrap();
        let id = format!("id {round}");
        let made = exchange_id(&server, 0, || Ok(id.clone().into_bytes())).unwrap();
        let got = exchange_id(&client, 1, || -> Result<Vec<u8>, CommError> {
            unreachable!("rank 1 never makes the id")
        })
        .unwrap();
        assert_eq!(
            (made.as_slice(), got.as_slice()),
            (id.as_bytes(), id.as_bytes())
        );
    }
}

#[cfg(unix)]
#[test]
fn a_store_descriptor_that_is_not_the_launchers_socket_is_named() {
    use std::os::fd::{AsRawFd, IntoRawFd};
    let base = [("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_PORT", "29500")];
    let with = |fd: &str| {
        let mut vars = base.to_vec();
        vars.push(("WEAVE_STORE_FD", fd));
        parsed(&vars).open_store(LONG).unwrap_err().to_string()
    };
    assert_eq!(
        error(&[base.as_slice(), &[("WEAVE_STORE_FD", "-1")]].concat()),
        "bootstrap failed: WEAVE_STORE_FD=-1 is not a descriptor number"
    );
    let e = with("1000000");
    assert!(
        e.contains("WEAVE_STORE_FD=1000000: not an open descriptor"),
        "{e}"
    );
    let file = std::fs::File::open(env!("CARGO_MANIFEST_DIR")).unwrap();
    let e = with(&file.as_raw_fd().to_string());
    assert!(e.contains("not a socket"), "{e}");
    // A socket that listens elsewhere than MASTER_PORT is left alone and named.
    let other = TcpListener::bind("127.0.0.1:0").unwrap();
    let other_port = other.local_addr().unwrap().port();
    let fd = other.into_raw_fd();
    let e = with(&fd.to_string());
    assert!(
        e.contains(&format!(
            "the socket listens at port {other_port}, not at MASTER_PORT's 29500"
        )),
        "{e}"
    );
}
