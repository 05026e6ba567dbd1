//! The test broker: Apache Kafka 4.x in KRaft mode (combined broker and controller), from
//! the jars `scripts/install-kafka` fetches with Maven into `target/tools/kafka/`.
//!
//! - [`broker`]: one single-node cluster per test binary, started on first use, killed with
//!   the test process; [`broker_with`] starts it with [`BrokerOptions`] instead.
//! - [`Broker::start`]: a cluster of the test's own (e.g. three nodes that the test restarts
//!   one by one, or one started later on a port the test chose).
//!
//! Every node listens on free loopback ports, keeps its data in a directory of its own
//! under `target/tmp`, and logs (WARN and the group coordinator's INFO) to a file there.

use std::fs::File;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::spawn::{free_port, installed, log_dir, passthrough_env, read_lossy, spawn_tied};
use super::topics::unique_name;

/// How long a cluster may take to answer metadata with every node (a cold JVM on 2 busy
/// cores takes 5-15 s; three nodes formatted and started side by side took 77 s while
/// other engineers' builds and tests loaded the machine to a load average of 25).
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// Any valid KRaft cluster id (16 bytes, base64url): every test cluster can share it.
const CLUSTER_ID: &str = "YWNrZC10ZXN0LWNsdXN0ZQ";

/// The directory `scripts/install-kafka` prints (libs/ and log4j2.properties):
/// `$ACKD_TEST_KAFKA_DIR`, else whatever the script installs (it is a no-op when present).
pub fn kafka_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| installed("ACKD_TEST_KAFKA_DIR", "scripts/install-kafka"))
}

/// How to start a cluster. The default: one node, plaintext.
#[derive(Debug, Clone)]
pub struct BrokerOptions {
    /// Nodes, each a broker and a KRaft controller (a 3-node quorum survives one down).
    pub nodes: usize,
    /// The first node's client port (e.g. one ackd was told before the broker existed);
    /// every other port is a free one.
    pub port: Option<u16>,
    /// Extra `server.properties` lines for every node (later keys win).
    pub server_config: Vec<(String, String)>,
    /// librdkafka properties the harness's own clients add (e.g. TLS or SASL settings when
    /// the client listener needs them).
    pub client_config: Vec<(String, String)>,
    /// The client listener's security protocol (`PLAINTEXT`, `SSL`, `SASL_PLAINTEXT`,
    /// `SASL_SSL`); its settings go in `server_config`.
    pub security_protocol: String,
    /// Extra `kafka-storage format` arguments for every node (e.g. `--add-scram
    /// 'SCRAM-SHA-512=[name=alice,password=...]'`: SCRAM users exist from the start).
    pub format_args: Vec<String>,
    /// A second client listener on the first node, advertised at this port (a
    /// [`super::proxy::Proxy`]'s): a client bootstrapped there makes every connection
    /// through the proxy. Forward the proxy to [`Broker::proxied_addr`].
    pub proxied_port: Option<u16>,
}

impl Default for BrokerOptions {
    fn default() -> Self {
        BrokerOptions {
            nodes: 1,
            port: None,
            server_config: Vec::new(),
            client_config: Vec::new(),
            security_protocol: "PLAINTEXT".into(),
            format_args: Vec::new(),
            proxied_port: None,
        }
    }
}

/// One KRaft node: its ports, files and process.
struct Node {
    id: usize,
    port: u16,
    /// Brokers replicate over a plaintext listener of their own, whatever the clients'
    /// listener requires.
    internal_port: u16,
    controller_port: u16,
    /// The listener advertised at [`BrokerOptions::proxied_port`] (first node only).
    proxied_listener_port: Option<u16>,
    dir: PathBuf,
    log_path: PathBuf,
    child: Mutex<Option<Child>>,
}

/// A running Kafka cluster (one node unless [`BrokerOptions::nodes`] says otherwise).
/// Killed (every node, SIGKILL) on drop.
pub struct Broker {
    nodes: Vec<Node>,
    options: BrokerOptions,
    started_in: Duration,
}

static BROKER: OnceLock<Broker> = OnceLock::new();

/// The test binary's broker, started on first use.
pub fn broker() -> &'static Broker {
    BROKER.get_or_init(|| Broker::start(BrokerOptions::default()))
}

/// Starts the test binary's broker with `options`. Must come before any use of
/// [`broker`] (panics if the broker was already started).
pub fn broker_with(options: BrokerOptions) -> &'static Broker {
    let mut started_here = false;
    let b = BROKER.get_or_init(|| {
        started_here = true;
        Broker::start(options)
    });
    assert!(
        started_here,
        "broker_with: the broker was already started; call it before anything uses broker()"
    );
    b
}

/// The binary's broker, keeping at most `max` bytes of commit metadata
/// (`offset.metadata.max.bytes`): the first call starts it, later ones return it.
pub fn broker_keeping_metadata(max: usize) -> &'static Broker {
    static B: std::sync::OnceLock<&'static Broker> = std::sync::OnceLock::new();
    B.get_or_init(|| {
        broker_with(BrokerOptions {
            server_config: vec![("offset.metadata.max.bytes".into(), max.to_string())],
            ..BrokerOptions::default()
        })
    })
}

/// A single-node cluster of the test's own whose client port is `port`.
pub fn start_broker_on(port: u16) -> Broker {
    Broker::start(BrokerOptions {
        port: Some(port),
        ..BrokerOptions::default()
    })
}

impl Drop for Broker {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill_node(i);
        }
        if let Some(dir) = self.nodes.first().and_then(|n| n.dir.parent()) {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Broker {
    /// Formats and starts every node, and waits until the cluster's metadata lists them all.
    pub fn start(options: BrokerOptions) -> Broker {
        let started = Instant::now();
        remove_stale_dirs();
        let root = log_dir().join(format!("kafka-{}-{}", std::process::id(), unique_name("c")));
        let nodes: Vec<Node> = (0..options.nodes)
            .map(|i| {
                let port = match (i, options.port) {
                    (0, Some(p)) => p,
                    _ => free_port(),
                };
                let dir = root.join(format!("node-{}", i + 1));
                std::fs::create_dir_all(&dir)
                    .unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
                Node {
                    id: i + 1,
                    port,
                    internal_port: free_port(),
                    controller_port: free_port(),
                    proxied_listener_port: (i == 0 && options.proxied_port.is_some())
                        .then(free_port),
                    log_path: dir.join("broker.log"),
                    dir,
                    child: Mutex::new(None),
                }
            })
            .collect();
        let mut broker = Broker {
            nodes,
            options,
            started_in: Duration::ZERO,
        };
        broker.write_configs();
        // Formatting is one JVM per node (about 2 s each): run them side by side.
        let formats: Vec<_> = broker
            .nodes
            .iter()
            .map(|n| n.format(&broker.options.format_args))
            .collect();
        for (node, f) in broker.nodes.iter().zip(formats) {
            let out = f
                .wait_with_output()
                .unwrap_or_else(|e| panic!("kafka storage format: {e}"));
            assert!(
                out.status.success(),
                "kafka storage format of node {} failed with {}:\n{}{}",
                node.id,
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        for i in 0..broker.nodes.len() {
            broker.start_node(i);
        }
        broker.wait_ready(started + START_TIMEOUT);
        broker.started_in = started.elapsed();
        eprintln!(
            "harness: kafka cluster of {} node(s) at {} ready in {:?} (logs {})",
            broker.nodes.len(),
            broker.bootstrap(),
            broker.started_in,
            broker.nodes[0].log_path.display()
        );
        broker
    }

    fn write_configs(&self) {
        self.write_configs_with(&[]);
    }

    /// Rewrites every node's `server.properties` with `overrides` after the options'
    /// `server_config` (later keys win): a node started from now on (see
    /// [`Broker::start_node`]) runs with them, e.g. a TLS listener that trusts another CA.
    pub fn rewrite_server_config(&self, overrides: &[(String, String)]) {
        self.write_configs_with(overrides);
    }

    fn write_configs_with(&self, overrides: &[(String, String)]) {
        let voters = self
            .nodes
            .iter()
            .map(|n| format!("{}@127.0.0.1:{}", n.id, n.controller_port))
            .collect::<Vec<_>>()
            .join(",");
        let replication = self.nodes.len().min(3).to_string();
        for n in &self.nodes {
            let (mut listeners, mut advertised, mut protocols) = (
                format!(
                    "CLIENT://127.0.0.1:{},INTERNAL://127.0.0.1:{},CONTROLLER://127.0.0.1:{}",
                    n.port, n.internal_port, n.controller_port
                ),
                format!(
                    "CLIENT://127.0.0.1:{},INTERNAL://127.0.0.1:{}",
                    n.port, n.internal_port
                ),
                format!(
                    "CLIENT:{},INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT",
                    self.options.security_protocol
                ),
            );
            if let (Some(own), Some(proxy)) = (n.proxied_listener_port, self.options.proxied_port) {
                listeners += &format!(",PROXIED://127.0.0.1:{own}");
                advertised += &format!(",PROXIED://127.0.0.1:{proxy}");
                protocols += &format!(",PROXIED:{}", self.options.security_protocol);
            }
            let mut props: Vec<(String, String)> = [
                ("process.roles", "broker,controller".to_string()),
                ("node.id", n.id.to_string()),
                ("controller.quorum.voters", voters.clone()),
                ("listeners", listeners),
                ("advertised.listeners", advertised),
                ("controller.listener.names", "CONTROLLER".into()),
                ("inter.broker.listener.name", "INTERNAL".into()),
                ("listener.security.protocol.map", protocols),
                ("log.dirs", n.dir.join("data").display().to_string()),
                ("offsets.topic.replication.factor", replication.clone()),
                ("offsets.topic.num.partitions", "4".into()),
                (
                    "transaction.state.log.replication.factor",
                    replication.clone(),
                ),
                ("transaction.state.log.min.isr", "1".into()),
                ("default.replication.factor", replication.clone()),
                ("min.insync.replicas", "1".into()),
                ("num.partitions", "4".into()),
                // Tests join and leave groups all the time: no wait for more members, and
                // the short session timeouts tests use (a killed member is replaced soon).
                ("group.initial.rebalance.delay.ms", "0".into()),
                ("group.min.session.timeout.ms", "500".into()),
                // KIP-848 groups: the broker sets the session and heartbeat.
                ("group.consumer.min.session.timeout.ms", "1000".into()),
                ("group.consumer.session.timeout.ms", "6000".into()),
                ("group.consumer.min.heartbeat.interval.ms", "250".into()),
                ("group.consumer.heartbeat.interval.ms", "500".into()),
                // A stopped node hands its leaderships over quickly.
                ("controlled.shutdown.enable", "true".into()),
                ("log.flush.interval.messages", "9223372036854775807".into()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
            props.extend(self.options.server_config.iter().cloned());
            props.extend(overrides.iter().cloned());
            let text: String = props.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
            let path = n.dir.join("server.properties");
            std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        }
    }

    /// Starts node `i` (again): same ports, same data.
    pub fn start_node(&self, i: usize) {
        let n = &self.nodes[i];
        let mut child = n.child.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = child.as_mut() {
            if c.try_wait().ok().flatten().is_none() {
                return;
            }
        }
        let log = File::options()
            .create(true)
            .append(true)
            .open(&n.log_path)
            .unwrap_or_else(|e| panic!("open {}: {e}", n.log_path.display()));
        let mut cmd = java(&[
            // Small and quick to start: the tests' load is light.
            "-Xms128m",
            "-Xmx512m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
        ]);
        cmd.arg("kafka.Kafka")
            .arg(n.dir.join("server.properties"))
            .stdout(log.try_clone().expect("clone log file"))
            .stderr(log);
        *child = Some(spawn_tied(cmd).unwrap_or_else(|e| panic!("spawn kafka node {}: {e}", n.id)));
    }

    /// Stops node `i` the way an operator does (SIGTERM: controlled shutdown, leaderships
    /// moved first) and waits for it to exit.
    pub fn stop_node(&self, i: usize) {
        self.signal_node(i, libc::SIGTERM, Duration::from_secs(60));
    }

    /// Kills node `i` (SIGKILL: no controlled shutdown) and reaps it. Idempotent.
    pub fn kill_node(&self, i: usize) {
        self.signal_node(i, libc::SIGKILL, Duration::from_secs(30));
    }

    fn signal_node(&self, i: usize, sig: libc::c_int, timeout: Duration) {
        let n = &self.nodes[i];
        let mut child = n.child.lock().unwrap_or_else(|e| e.into_inner());
        let Some(c) = child.as_mut() else { return };
        if c.try_wait().ok().flatten().is_none() {
            // SAFETY: the child is not reaped (we hold it), so the pid is still ours.
            unsafe {
                libc::kill(c.id() as libc::pid_t, sig);
            }
            let deadline = Instant::now() + timeout;
            while c.try_wait().ok().flatten().is_none() {
                if Instant::now() >= deadline {
                    let _ = c.kill();
                    let _ = c.wait();
                    break;
                }
                thread::sleep(Duration::from_millis(20));
            }
        }
        *child = None;
    }

    /// Kills every node (SIGKILL). Idempotent.
    pub fn stop(&self) {
        for i in 0..self.nodes.len() {
            self.kill_node(i);
        }
    }

    /// Waits until node `i` answers metadata and the cluster lists every running node.
    pub fn wait_node_ready(&self, i: usize) {
        let deadline = Instant::now() + START_TIMEOUT;
        self.wait_node_listening(i);
        self.wait_ready(deadline);
    }

    fn wait_ready(&self, deadline: Instant) {
        let running: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.node_running(i))
            .collect();
        let mut last_error;
        loop {
            for &i in &running {
                self.assert_node_running(i);
            }
            let consumer: BaseConsumer = self
                .client_config()
                .create()
                .expect("create metadata consumer");
            match consumer.fetch_metadata(None, Duration::from_secs(2)) {
                Ok(md) if md.brokers().len() >= running.len() => {
                    if self.offsets_topic_ready() {
                        return;
                    }
                    last_error = "the group coordinator is not ready yet".into();
                }
                Ok(md) => {
                    last_error = format!("{} of {} nodes listed", md.brokers().len(), running.len())
                }
                Err(e) => last_error = e.to_string(),
            }
            assert!(
                Instant::now() < deadline,
                "kafka cluster at {} not ready within {START_TIMEOUT:?} ({last_error}); log {}:\n{}",
                self.bootstrap(),
                self.nodes[0].log_path.display(),
                tail(&self.nodes[0].log_path)
            );
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// True once a group's committed offsets can be read: the first time, the broker creates
    /// `__consumer_offsets`, and answers NOT_COORDINATOR until that is done.
    fn offsets_topic_ready(&self) -> bool {
        let consumer: BaseConsumer = self
            .client_config()
            .set("group.id", "harness-warm-up")
            .create()
            .expect("create warm-up consumer");
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition("harness-warm-up", 0);
        consumer
            .committed_offsets(tpl, Duration::from_secs(5))
            .is_ok()
    }

    fn node_running(&self, i: usize) -> bool {
        let mut child = self.nodes[i]
            .child
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    #[track_caller]
    fn assert_node_running(&self, i: usize) {
        let n = &self.nodes[i];
        assert!(
            self.node_running(i),
            "kafka node {} is not running; log {}:\n{}",
            n.id,
            n.log_path.display(),
            tail(&n.log_path)
        );
    }

    /// Panics (with the log's end) if any node has exited.
    pub fn assert_running(&self) {
        for i in 0..self.nodes.len() {
            self.assert_node_running(i);
        }
    }

    /// Where a proxy in front of the first node forwards to: the listener advertised at
    /// [`BrokerOptions::proxied_port`].
    pub fn proxied_addr(&self) -> SocketAddr {
        let port = self.nodes[0]
            .proxied_listener_port
            .expect("the broker was started without BrokerOptions::proxied_port");
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// The first node's client port.
    pub fn port(&self) -> u16 {
        self.nodes[0].port
    }

    /// Every node's client port.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// `127.0.0.1:PORT,...` of every node, for `bootstrap.servers` / `KAFKA_URL`.
    pub fn bootstrap(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The properties the harness's own clients add ([`BrokerOptions::client_config`]).
    pub fn client_properties(&self) -> &[(String, String)] {
        &self.options.client_config
    }

    /// A librdkafka configuration for this cluster, as the harness's clients use it.
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", self.bootstrap());
        for (k, v) in &self.options.client_config {
            config.set(k, v);
        }
        config
    }

    /// Waits until node `i` accepts TCP connections on its client port, without asking it
    /// anything: for a listener that the harness's own clients cannot pass (a TLS listener
    /// that no longer trusts their certificate).
    pub fn wait_node_listening(&self, i: usize) {
        let deadline = Instant::now() + START_TIMEOUT;
        let addr = SocketAddr::from(([127, 0, 0, 1], self.nodes[i].port));
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            self.assert_node_running(i);
            assert!(
                Instant::now() < deadline,
                "kafka node {} did not accept connections within {START_TIMEOUT:?}; log {}:\n{}",
                self.nodes[i].id,
                self.nodes[i].log_path.display(),
                tail(&self.nodes[i].log_path)
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// The first node's log.
    pub fn log_path(&self) -> &Path {
        &self.nodes[0].log_path
    }

    /// How long the cluster took to start (format included).
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// Node `i`'s process id, if it runs (for its memory).
    pub fn node_pid(&self, i: usize) -> Option<u32> {
        let child = self.nodes[i]
            .child
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        child.as_ref().map(Child::id)
    }

    /// The node id (1-based) of the node at index `i`.
    pub fn node_id(&self, i: usize) -> i32 {
        self.nodes[i].id as i32
    }

    /// Number of nodes.
    /// Node `i`'s data directory (`log.dirs`): `<topic>-<partition>/` segment files.
    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.nodes[i].dir.join("data")
    }

    pub fn nodes(&self) -> usize {
        self.nodes.len()
    }
}

impl Node {
    /// `kafka-storage format` for this node, started (not waited for).
    fn format(&self, extra: &[String]) -> Child {
        let mut cmd = java(&["-Xmx256m", "-XX:TieredStopAtLevel=1"]);
        cmd.args(["kafka.tools.StorageTool", "format", "--ignore-formatted"])
            .args(["--cluster-id", CLUSTER_ID, "--config"])
            .arg(self.dir.join("server.properties"))
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd.spawn()
            .unwrap_or_else(|e| panic!("spawn java (kafka storage format): {e}"))
    }
}

/// `java` with the broker's class path and log configuration, and `jvm` options.
fn java(jvm: &[&str]) -> Command {
    let dir = kafka_dir();
    let mut cmd = Command::new("java");
    cmd.args(jvm)
        .arg(format!(
            "-Dlog4j2.configurationFile={}",
            dir.join("log4j2.properties").display()
        ))
        .arg("-cp")
        // Java expands the `*` itself.
        .arg(format!("{}/libs/*", dir.display()))
        .env_clear()
        .envs(passthrough_env())
        .stdin(Stdio::null());
    cmd
}

/// Removes the data of clusters whose test process is gone.
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(log_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("kafka-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// The last 100 lines of a log.
fn tail(path: &Path) -> String {
    let text = read_lossy(path);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(100)..].join("\n")
}

/// Creates `name` with `partitions` partitions (replicated on up to 3 nodes) on `b`, and
/// waits until every partition has a leader.
pub fn create_topic_on(b: &Broker, name: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> =
        b.client_config().create().expect("create admin client");
    let replication = b.nodes().min(3) as i32;
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(replication));
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = futures::executor::block_on(admin.create_topics([&topic], &opts))
        .unwrap_or_else(|e| panic!("create topic {name}: {e}"));
    for r in results {
        if let Err((t, e)) = r {
            panic!("create topic {t} ({partitions} partitions): {e}");
        }
    }
    wait_for_leaders(b, name, partitions);
}

/// Waits until `topic` has `partitions` partitions, each with a leader.
pub fn wait_for_leaders(b: &Broker, topic: &str, partitions: i32) {
    let consumer: BaseConsumer = b
        .client_config()
        .create()
        .expect("create metadata consumer");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(md) = consumer.fetch_metadata(Some(topic), Duration::from_secs(5)) {
            let ready = md.topics().iter().any(|t| {
                t.error().is_none()
                    && t.partitions().len() == partitions as usize
                    && t.partitions().iter().all(|p| p.leader() >= 0)
            });
            if ready {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "topic {topic}: {partitions} partitions with leaders not seen within 30 s"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

// Faults on a cluster of a test's own: whom to kill, and what a node costs.
impl Broker {
    /// The index of the node that coordinates `group` (the leader of the group's
    /// `__consumer_offsets` partition), as the brokers answer ListGroups and DescribeGroups
    /// through librdkafka. Waits (up to 60 s) for a coordinator that knows the group: it
    /// must have a member or a commit.
    pub fn coordinator_of(&self, group: &str) -> usize {
        use rdkafka::bindings as rdsys;
        use rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR as NO_ERROR;
        let client: BaseConsumer = self
            .client_config()
            .create()
            .expect("create group-list client");
        let group_c = std::ffi::CString::new(group).expect("group name without NUL");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut list: *const rdsys::rd_kafka_group_list = std::ptr::null();
            let mut coordinator = None;
            // SAFETY: the client outlives the call; a list returned is read while alive and
            // destroyed once, here.
            unsafe {
                let err = rdsys::rd_kafka_list_groups(
                    client.client().native_ptr(),
                    group_c.as_ptr(),
                    &mut list,
                    5000,
                );
                if err == NO_ERROR && !list.is_null() {
                    let l = &*list;
                    let groups = if l.groups.is_null() {
                        &[][..]
                    } else {
                        std::slice::from_raw_parts(l.groups, l.group_cnt.max(0) as usize)
                    };
                    coordinator = groups
                        .iter()
                        .find(|g| {
                            g.err == NO_ERROR
                                && std::ffi::CStr::from_ptr(g.group).to_bytes() == group.as_bytes()
                        })
                        .map(|g| g.broker.id);
                }
                if !list.is_null() {
                    rdsys::rd_kafka_group_list_destroy(list);
                }
            }
            if let Some(i) =
                coordinator.and_then(|id| (0..self.nodes()).find(|&i| self.node_id(i) == id))
            {
                return i;
            }
            assert!(
                Instant::now() < deadline,
                "no coordinator of group {group} found within 60 s"
            );
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// Node `i`'s peak resident memory (`VmHWM` of `/proc/PID/status`) in KiB, if it runs.
    pub fn node_peak_rss_kib(&self, i: usize) -> Option<u64> {
        self.node_pid(i).map(super::ackd::peak_rss_kib)
    }
}

/// Waits until every partition of every topic on `b` (`__consumer_offsets` included) has
/// all its replicas in sync: a node restarted has caught up, and the next one may go
/// without taking a partition's last in-sync replica with it.
pub fn wait_for_full_isr(b: &Broker, timeout: Duration) {
    let client: BaseConsumer = b.client_config().create().expect("create metadata client");
    let deadline = Instant::now() + timeout;
    loop {
        let behind = match client.fetch_metadata(None, Duration::from_secs(5)) {
            Ok(md) => {
                let behind = md
                    .topics()
                    .iter()
                    .flat_map(|t| {
                        t.partitions()
                            .iter()
                            .filter(|p| p.leader() < 0 || p.isr().len() < p.replicas().len())
                            .map(move |p| {
                                format!(
                                    "{}/{} isr {:?} of {:?}",
                                    t.name(),
                                    p.id(),
                                    p.isr(),
                                    p.replicas()
                                )
                            })
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                if behind.is_empty() {
                    return;
                }
                behind
            }
            Err(e) => e.to_string(),
        };
        assert!(
            Instant::now() < deadline,
            "replicas not in sync within {timeout:?}: {behind}"
        );
        thread::sleep(Duration::from_millis(200));
    }
}
