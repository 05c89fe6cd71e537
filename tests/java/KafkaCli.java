// A small command-line Kafka client built on the official Java kafka-clients, used by the tests as an
// independent judge of wire compatibility. No build tool: tests/helpers/java_client.py compiles it with javac.
//
// Output: one JSON object per line on stdout. Record/offset lines have "type":"record"/"offset"; the last line
// is always the summary ("type":"summary" for produce/consume, "type":"admin" for admin). Diagnostics go to stderr.
// Exit code 0 when the command ran (Kafka errors are reported inside the JSON), 2 on usage errors, 1 on a crash.
//
//   produce --bootstrap B --topic T --count N [--acks all|1|0] [--compression none|gzip|snappy|lz4|zstd]
//           [--idempotent true|false] [--size BYTES | --value-format FMT] [--key-format FMT] [--partition P]
//           [--header k=v]... [--timestamp MS] [--linger-ms MS] [--batch-size BYTES] [--print-offsets true]
//           [--transactional-id ID [--txn-count K] [--txn-pattern ca...]] [--timeout-ms MS] [--prop k=v]...
//   consume --bootstrap B --topic T[,T2] [--group G] [--count N] [--timeout-ms MS] [--idle-timeout-ms MS]
//           [--from earliest|latest] [--isolation read_committed|read_uncommitted] [--commit true|false]
//           [--partition P [--offset O]] [--print-records true|false] [--prop k=v]...
//   admin   --bootstrap B <action> ...   actions: create, delete, list, describe, describe-configs,
//           alter-configs, create-partitions, list-offsets, list-groups, describe-groups, group-offsets, cluster

import java.nio.charset.StandardCharsets;
import java.util.*;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.*;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class KafkaCli {

    // ------------------------------------------------------------------ arguments
    static final class Args {
        final List<String> positional = new ArrayList<>();
        final Map<String, List<String>> opts = new LinkedHashMap<>();

        Args(String[] argv, int from) {
            for (int i = from; i < argv.length; i++) {
                String a = argv[i];
                if (a.startsWith("--")) {
                    String key = a.substring(2);
                    String val;
                    int eq = key.indexOf('=');
                    if (eq >= 0) {
                        val = key.substring(eq + 1);
                        key = key.substring(0, eq);
                    } else if (i + 1 < argv.length) {
                        val = argv[++i];
                    } else {
                        throw new Usage("option --" + key + " needs a value");
                    }
                    opts.computeIfAbsent(key, k -> new ArrayList<>()).add(val);
                } else {
                    positional.add(a);
                }
            }
        }

        String get(String k, String dflt) {
            List<String> v = opts.get(k);
            return v == null ? dflt : v.get(v.size() - 1);
        }

        String req(String k) {
            String v = get(k, null);
            if (v == null) throw new Usage("missing --" + k);
            return v;
        }

        boolean has(String k) { return opts.containsKey(k); }

        long getLong(String k, long dflt) { String v = get(k, null); return v == null ? dflt : Long.parseLong(v); }

        int getInt(String k, int dflt) { String v = get(k, null); return v == null ? dflt : Integer.parseInt(v); }

        boolean getBool(String k, boolean dflt) { String v = get(k, null); return v == null ? dflt : Boolean.parseBoolean(v); }

        List<String> all(String k) {
            List<String> out = new ArrayList<>();
            for (String v : opts.getOrDefault(k, List.of())) {
                for (String part : v.split(",")) if (!part.isEmpty()) out.add(part);
            }
            return out;
        }

        /** Repeatable k=v options (not split on commas: config values may contain commas). */
        Map<String, String> kv(String k) {
            Map<String, String> out = new LinkedHashMap<>();
            for (String v : opts.getOrDefault(k, List.of())) {
                int eq = v.indexOf('=');
                if (eq < 0) throw new Usage("--" + k + " expects key=value, got " + v);
                out.put(v.substring(0, eq), v.substring(eq + 1));
            }
            return out;
        }
    }

    static final class Usage extends RuntimeException {
        Usage(String m) { super(m); }
    }

    // ------------------------------------------------------------------ JSON
    static String json(Object o) {
        StringBuilder sb = new StringBuilder();
        writeJson(sb, o);
        return sb.toString();
    }

    @SuppressWarnings("unchecked")
    static void writeJson(StringBuilder sb, Object o) {
        if (o == null) {
            sb.append("null");
        } else if (o instanceof String) {
            quote(sb, (String) o);
        } else if (o instanceof Boolean || o instanceof Integer || o instanceof Long || o instanceof Short) {
            sb.append(o);
        } else if (o instanceof Number) {
            double d = ((Number) o).doubleValue();
            if (Double.isFinite(d)) sb.append(d); else sb.append("null");
        } else if (o instanceof Map) {
            sb.append('{');
            boolean first = true;
            for (Map.Entry<Object, Object> e : ((Map<Object, Object>) o).entrySet()) {
                if (!first) sb.append(',');
                first = false;
                quote(sb, String.valueOf(e.getKey()));
                sb.append(':');
                writeJson(sb, e.getValue());
            }
            sb.append('}');
        } else if (o instanceof Collection) {
            sb.append('[');
            boolean first = true;
            for (Object x : (Collection<Object>) o) {
                if (!first) sb.append(',');
                first = false;
                writeJson(sb, x);
            }
            sb.append(']');
        } else {
            quote(sb, o.toString());
        }
    }

    static void quote(StringBuilder sb, String s) {
        sb.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': sb.append("\\\""); break;
                case '\\': sb.append("\\\\"); break;
                case '\n': sb.append("\\n"); break;
                case '\r': sb.append("\\r"); break;
                case '\t': sb.append("\\t"); break;
                default:
                    if (c < 0x20) sb.append(String.format("\\u%04x", (int) c)); else sb.append(c);
            }
        }
        sb.append('"');
    }

    static Map<String, Object> obj(Object... kv) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int i = 0; i + 1 < kv.length; i += 2) m.put((String) kv[i], kv[i + 1]);
        return m;
    }

    static synchronized void emit(Map<String, Object> m) {
        System.out.println(json(m));
    }

    static Throwable root(Throwable t) {
        if (t instanceof ExecutionException && t.getCause() != null) return t.getCause();
        return t;
    }

    static Map<String, Object> err(Throwable t) {
        Throwable r = root(t);
        return obj("error_class", r.getClass().getSimpleName(), "error", String.valueOf(r.getMessage()));
    }

    static String str(byte[] b) { return b == null ? null : new String(b, StandardCharsets.UTF_8); }

    // ------------------------------------------------------------------ main
    public static void main(String[] argv) {
        if (argv.length == 0) {
            System.err.println("usage: KafkaCli produce|consume|admin ... (see the header of KafkaCli.java)");
            System.exit(2);
        }
        int rc;
        try {
            Args a = new Args(argv, 1);
            switch (argv[0]) {
                case "produce": rc = produce(a); break;
                case "consume": rc = consume(a); break;
                case "admin": rc = admin(a); break;
                default: throw new Usage("unknown command " + argv[0]);
            }
        } catch (Usage u) {
            System.err.println("usage error: " + u.getMessage());
            emit(obj("type", "fatal", "error_class", "Usage", "error", u.getMessage()));
            rc = 2;
        } catch (Throwable t) {
            t.printStackTrace();
            Map<String, Object> m = obj("type", "fatal");
            m.putAll(err(t));
            emit(m);
            rc = 1;
        }
        System.out.flush();
        // Client threads are closed above; exit explicitly so a stuck non-daemon thread cannot hang the test.
        Runtime.getRuntime().halt(rc);
    }

    static Properties baseProps(Args a) {
        Properties p = new Properties();
        p.put("bootstrap.servers", a.req("bootstrap"));
        p.put("client.id", a.get("client-id", "kafkacli-java"));
        long t = a.getLong("timeout-ms", 30000);
        p.put("request.timeout.ms", Long.toString(Math.min(t, 30000)));
        p.put("default.api.timeout.ms", Long.toString(t));
        return p;
    }

    // ------------------------------------------------------------------ produce
    static byte[] value(Args a, long i, int size) {
        String fmt = a.get("value-format", null);
        if (fmt != null) return String.format(fmt, i).getBytes(StandardCharsets.UTF_8);
        byte[] b = new byte[size];
        byte[] prefix = (i + ":").getBytes(StandardCharsets.UTF_8);
        for (int j = 0; j < size; j++) b[j] = j < prefix.length ? prefix[j] : (byte) ('a' + (int) ((i + j) % 26));
        return b;
    }

    static int produce(Args a) throws Exception {
        String topic = a.req("topic");
        long count = a.getLong("count", 1);
        int size = a.getInt("size", 100);
        long timeout = a.getLong("timeout-ms", 30000);
        Properties p = baseProps(a);
        p.remove("default.api.timeout.ms");
        p.put("acks", a.get("acks", "all"));
        p.put("compression.type", a.get("compression", "none"));
        if (a.has("idempotent")) p.put("enable.idempotence", a.get("idempotent", "true"));
        p.put("linger.ms", a.get("linger-ms", "5"));
        p.put("batch.size", a.get("batch-size", "65536"));
        p.put("max.block.ms", Long.toString(timeout));
        p.put("delivery.timeout.ms", Long.toString(Math.max(timeout, Long.parseLong(a.get("linger-ms", "5")) + 30000)));
        String txnId = a.get("transactional-id", null);
        if (txnId != null) p.put("transactional.id", txnId);
        p.putAll(a.kv("prop"));
        Integer partition = a.has("partition") ? a.getInt("partition", 0) : null;
        Long ts = a.has("timestamp") ? a.getLong("timestamp", 0) : null;
        String keyFmt = a.get("key-format", null);
        Map<String, String> headers = a.kv("header");
        boolean printOffsets = a.getBool("print-offsets", false);
        int txnCount = txnId == null ? 0 : a.getInt("txn-count", 1);
        String pattern = a.get("txn-pattern", "c");

        final AtomicLong acked = new AtomicLong();
        final AtomicLong failed = new AtomicLong();
        final Map<String, Long> errorCounts = new TreeMap<>();
        final Map<Integer, long[]> perPartition = new TreeMap<>(); // partition -> {count, min, max}
        List<Map<String, Object>> txnResults = new ArrayList<>();
        long start = System.nanoTime();
        long[] lastAckNanos = {start};

        Map<String, Object> fatal = null;
        try (KafkaProducer<byte[], byte[]> producer =
                     new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer())) {
          try {
            if (txnId != null) producer.initTransactions();
            long perTxn = txnCount > 0 ? (count + txnCount - 1) / txnCount : count;
            long i = 0;
            int txnIndex = 0;
            while (i < count || (txnId != null && txnIndex < txnCount)) {
                long end = Math.min(count, i + perTxn);
                if (txnId != null) producer.beginTransaction();
                for (; i < end; i++) {
                    final long idx = i;
                    byte[] key = keyFmt == null ? null : String.format(keyFmt, i).getBytes(StandardCharsets.UTF_8);
                    ProducerRecord<byte[], byte[]> rec = new ProducerRecord<>(topic, partition, ts, key, value(a, i, size));
                    for (Map.Entry<String, String> h : headers.entrySet()) {
                        rec.headers().add(h.getKey(), h.getValue().getBytes(StandardCharsets.UTF_8));
                    }
                    Callback cb = (md, ex) -> {
                        synchronized (perPartition) {
                            if (ex != null) {
                                failed.incrementAndGet();
                                Throwable r = root(ex);
                                errorCounts.merge(r.getClass().getSimpleName() + ": " + r.getMessage(), 1L, Long::sum);
                                if (printOffsets) {
                                    Map<String, Object> m = obj("type", "offset", "index", idx);
                                    m.putAll(err(ex));
                                    emit(m);
                                }
                            } else {
                                acked.incrementAndGet();
                                lastAckNanos[0] = System.nanoTime();
                                long off = md.hasOffset() ? md.offset() : -1;
                                long[] s = perPartition.computeIfAbsent(md.partition(), k -> new long[]{0, Long.MAX_VALUE, -1});
                                s[0]++;
                                if (off >= 0) { s[1] = Math.min(s[1], off); s[2] = Math.max(s[2], off); }
                                if (printOffsets) {
                                    emit(obj("type", "offset", "index", idx, "partition", md.partition(), "offset", off,
                                            "timestamp", md.timestamp()));
                                }
                            }
                        }
                    };
                    try {
                        producer.send(rec, cb);
                    } catch (Exception ex) {
                        cb.onCompletion(null, ex);
                    }
                }
                if (txnId != null) {
                    boolean commit = pattern.charAt(txnIndex % pattern.length()) != 'a';
                    Map<String, Object> tr = obj("txn", txnIndex, "action", commit ? "commit" : "abort");
                    try {
                        if (commit) producer.commitTransaction(); else { producer.flush(); producer.abortTransaction(); }
                        tr.put("ok", true);
                    } catch (Exception ex) {
                        tr.put("ok", false);
                        tr.putAll(err(ex));
                    }
                    txnResults.add(tr);
                    txnIndex++;
                }
            }
            producer.flush();
          } catch (Exception ex) {
            // e.g. initTransactions() timing out: report it in the summary instead of crashing.
            fatal = err(ex);
          }
            producer.close(java.time.Duration.ofMillis(fatal == null ? timeout : 0));
        }
        double secs = (lastAckNanos[0] - start) / 1e9;
        Map<String, Object> parts = new TreeMap<>();
        synchronized (perPartition) {
            for (Map.Entry<Integer, long[]> e : perPartition.entrySet()) {
                long[] s = e.getValue();
                parts.put(Integer.toString(e.getKey()),
                        obj("count", s[0], "first_offset", s[1] == Long.MAX_VALUE ? -1 : s[1], "last_offset", s[2]));
            }
        }
        Map<String, Object> summary = obj("type", "summary", "command", "produce", "topic", topic, "requested", count,
                "acked", acked.get(), "errors", failed.get(), "error_messages", errorCounts,
                "partitions", parts, "elapsed_s", secs,
                "records_per_s", secs > 0 ? acked.get() / secs : null);
        if (txnId != null) summary.put("transactions", txnResults);
        if (fatal != null) summary.put("error", fatal);
        emit(summary);
        return 0;
    }

    // ------------------------------------------------------------------ consume
    static int consume(Args a) throws Exception {
        List<String> topics = a.all("topic");
        if (topics.isEmpty()) throw new Usage("missing --topic");
        String group = a.get("group", null);
        long count = a.getLong("count", Long.MAX_VALUE);
        long timeout = a.getLong("timeout-ms", 30000);
        long idle = a.getLong("idle-timeout-ms", 0);
        boolean print = a.getBool("print-records", true);
        boolean commit = a.getBool("commit", group != null);
        Properties p = baseProps(a);
        p.put("auto.offset.reset", a.get("from", "earliest"));
        p.put("enable.auto.commit", "false");
        p.put("isolation.level", a.get("isolation", "read_uncommitted"));
        if (group != null) p.put("group.id", group);
        p.putAll(a.kv("prop"));

        long start = System.nanoTime();
        long deadline = start + timeout * 1_000_000L;
        long firstNanos = -1, lastNanos = -1;
        long n = 0, bytes = 0;
        Map<TopicPartition, long[]> stats = new TreeMap<>(Comparator.comparing(TopicPartition::toString));
        Map<String, Object> error = null;
        Map<String, Object> positions = new TreeMap<>();
        Map<String, Object> committed = new TreeMap<>();
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            try {
                if (group != null && !a.has("partition")) {
                    c.subscribe(topics);
                } else {
                    List<TopicPartition> tps = new ArrayList<>();
                    for (String t : topics) {
                        if (a.has("partition")) {
                            tps.add(new TopicPartition(t, a.getInt("partition", 0)));
                        } else {
                            List<PartitionInfo> infos = c.partitionsFor(t, java.time.Duration.ofMillis(timeout));
                            for (PartitionInfo pi : infos) tps.add(new TopicPartition(t, pi.partition()));
                        }
                    }
                    c.assign(tps);
                    if (a.has("offset")) {
                        for (TopicPartition tp : tps) c.seek(tp, a.getLong("offset", 0));
                    } else if (group == null) {
                        if ("latest".equals(a.get("from", "earliest"))) c.seekToEnd(tps); else c.seekToBeginning(tps);
                    }
                }
                while (n < count) {
                    long now = System.nanoTime();
                    if (now > deadline) break;
                    if (idle > 0 && lastNanos > 0 && now - lastNanos > idle * 1_000_000L) break;
                    ConsumerRecords<byte[], byte[]> recs = c.poll(java.time.Duration.ofMillis(
                            Math.max(1, Math.min(500, (deadline - now) / 1_000_000L))));
                    if (recs.isEmpty()) continue;
                    long t = System.nanoTime();
                    if (firstNanos < 0) firstNanos = t;
                    lastNanos = t;
                    for (ConsumerRecord<byte[], byte[]> r : recs) {
                        n++;
                        int vl = r.value() == null ? 0 : r.value().length;
                        int kl = r.key() == null ? 0 : r.key().length;
                        bytes += vl + kl;
                        TopicPartition tp = new TopicPartition(r.topic(), r.partition());
                        long[] s = stats.computeIfAbsent(tp, k -> new long[]{0, Long.MAX_VALUE, -1});
                        s[0]++;
                        s[1] = Math.min(s[1], r.offset());
                        s[2] = Math.max(s[2], r.offset());
                        if (print) {
                            Map<String, Object> h = new LinkedHashMap<>();
                            for (Header hd : r.headers()) h.put(hd.key(), str(hd.value()));
                            emit(obj("type", "record", "topic", r.topic(), "partition", r.partition(),
                                    "offset", r.offset(), "timestamp", r.timestamp(),
                                    "timestamp_type", r.timestampType().name(), "key", str(r.key()),
                                    "value", str(r.value()), "value_len", vl, "headers", h,
                                    "leader_epoch", r.leaderEpoch().orElse(null)));
                        }
                    }
                    if (commit) c.commitSync();
                }
                for (TopicPartition tp : c.assignment()) {
                    try { positions.put(tp.toString(), c.position(tp, java.time.Duration.ofMillis(5000))); }
                    catch (Exception ex) { positions.put(tp.toString(), null); }
                }
                if (group != null && !c.assignment().isEmpty()) {
                    Map<TopicPartition, OffsetAndMetadata> cm = c.committed(c.assignment(), java.time.Duration.ofMillis(5000));
                    for (Map.Entry<TopicPartition, OffsetAndMetadata> e : cm.entrySet()) {
                        committed.put(e.getKey().toString(), e.getValue() == null ? null : e.getValue().offset());
                    }
                }
            } catch (Exception ex) {
                error = err(ex);
            }
            c.close(java.time.Duration.ofMillis(5000));
        }
        Map<String, Object> parts = new TreeMap<>();
        for (Map.Entry<TopicPartition, long[]> e : stats.entrySet()) {
            long[] s = e.getValue();
            parts.put(e.getKey().toString(), obj("count", s[0], "first_offset", s[1], "last_offset", s[2]));
        }
        double active = firstNanos > 0 ? (lastNanos - firstNanos) / 1e9 : 0;
        Map<String, Object> summary = obj("type", "summary", "command", "consume", "count", n, "bytes", bytes,
                "partitions", parts, "positions", positions, "committed", committed,
                "elapsed_s", (System.nanoTime() - start) / 1e9,
                "first_record_after_s", firstNanos > 0 ? (firstNanos - start) / 1e9 : null,
                "active_s", active, "records_per_s", active > 0 ? n / active : null);
        if (error != null) summary.put("error", error);
        emit(summary);
        return 0;
    }

    // ------------------------------------------------------------------ admin
    static int admin(Args a) throws Exception {
        if (a.positional.isEmpty()) throw new Usage("admin needs an action");
        String action = a.positional.get(0);
        Properties p = baseProps(a);
        p.putAll(a.kv("prop"));
        long timeout = a.getLong("timeout-ms", 30000);
        Map<String, Object> out = obj("type", "admin", "action", action);
        try (Admin admin = Admin.create(p)) {
            try {
                switch (action) {
                    case "create": adminCreate(admin, a, out); break;
                    case "delete": adminDelete(admin, a, out); break;
                    case "list": {
                        Set<String> names = admin.listTopics(new ListTopicsOptions().listInternal(a.getBool("internal", false)))
                                .names().get(timeout, TimeUnit.MILLISECONDS);
                        out.put("topics", new TreeSet<>(names));
                        break;
                    }
                    case "describe": adminDescribe(admin, a, out); break;
                    case "describe-configs": adminDescribeConfigs(admin, a, out); break;
                    case "alter-configs": adminAlterConfigs(admin, a, out); break;
                    case "create-partitions": {
                        Map<String, NewPartitions> req = new LinkedHashMap<>();
                        for (String t : a.all("topic")) req.put(t, NewPartitions.increaseTo(a.getInt("total", 1)));
                        perKey(admin.createPartitions(req).values(), out);
                        break;
                    }
                    case "list-offsets": adminListOffsets(admin, a, out); break;
                    case "list-groups": {
                        List<Object> gs = new ArrayList<>();
                        for (ConsumerGroupListing g : admin.listConsumerGroups().all().get(timeout, TimeUnit.MILLISECONDS)) {
                            gs.add(obj("group", g.groupId(), "simple", g.isSimpleConsumerGroup(),
                                    "state", g.state().map(Object::toString).orElse(null)));
                        }
                        out.put("groups", gs);
                        break;
                    }
                    case "describe-groups": adminDescribeGroups(admin, a, out); break;
                    case "group-offsets": {
                        Map<String, Object> offs = new TreeMap<>();
                        Map<TopicPartition, OffsetAndMetadata> m = admin.listConsumerGroupOffsets(a.req("group"))
                                .partitionsToOffsetAndMetadata().get(timeout, TimeUnit.MILLISECONDS);
                        for (Map.Entry<TopicPartition, OffsetAndMetadata> e : m.entrySet()) {
                            offs.put(e.getKey().toString(), e.getValue() == null ? null : e.getValue().offset());
                        }
                        out.put("offsets", offs);
                        break;
                    }
                    case "cluster": {
                        DescribeClusterResult r = admin.describeCluster();
                        List<Object> nodes = new ArrayList<>();
                        for (Node nd : r.nodes().get(timeout, TimeUnit.MILLISECONDS)) nodes.add(node(nd));
                        out.put("cluster_id", r.clusterId().get(timeout, TimeUnit.MILLISECONDS));
                        out.put("controller", node(r.controller().get(timeout, TimeUnit.MILLISECONDS)));
                        out.put("nodes", nodes);
                        break;
                    }
                    default: throw new Usage("unknown admin action " + action);
                }
                if (!out.containsKey("ok")) out.put("ok", true);
            } catch (Usage u) {
                throw u;
            } catch (Exception ex) {
                out.put("ok", false);
                out.putAll(err(ex));
            }
            admin.close(java.time.Duration.ofMillis(5000));
        }
        emit(out);
        return 0;
    }

    static Map<String, Object> node(Node n) {
        return n == null ? null : obj("id", n.id(), "host", n.host(), "port", n.port(), "rack", n.rack());
    }

    /** Fill out["results"][key] from per-key futures; out["ok"] = all succeeded. */
    static <K> void perKey(Map<K, KafkaFuture<Void>> futures, Map<String, Object> out) {
        Map<String, Object> results = new LinkedHashMap<>();
        boolean ok = true;
        for (Map.Entry<K, KafkaFuture<Void>> e : futures.entrySet()) {
            try {
                e.getValue().get();
                results.put(String.valueOf(e.getKey()), obj("ok", true));
            } catch (Exception ex) {
                ok = false;
                Map<String, Object> m = obj("ok", false);
                m.putAll(err(ex));
                results.put(String.valueOf(e.getKey()), m);
            }
        }
        out.put("results", results);
        out.put("ok", ok);
    }

    static void adminCreate(Admin admin, Args a, Map<String, Object> out) {
        List<String> topics = a.all("topic");
        if (topics.isEmpty()) throw new Usage("missing --topic");
        Optional<Integer> parts = a.has("partitions") ? Optional.of(a.getInt("partitions", 1)) : Optional.empty();
        Optional<Short> rf = a.has("replication-factor")
                ? Optional.of((short) a.getInt("replication-factor", 1)) : Optional.empty();
        Map<String, String> configs = a.kv("config");
        List<NewTopic> req = new ArrayList<>();
        for (String t : topics) req.add(new NewTopic(t, parts, rf).configs(configs));
        CreateTopicsResult r = admin.createTopics(req, new CreateTopicsOptions().validateOnly(a.getBool("validate-only", false)));
        Map<String, Object> results = new LinkedHashMap<>();
        boolean ok = true;
        for (String t : topics) {
            Map<String, Object> m = new LinkedHashMap<>();
            try {
                r.values().get(t).get();
                m.put("ok", true);
                try { m.put("topic_id", String.valueOf(r.topicId(t).get())); } catch (Exception ignored) { }
                try { m.put("num_partitions", r.numPartitions(t).get()); } catch (Exception ignored) { }
                try { m.put("replication_factor", r.replicationFactor(t).get()); } catch (Exception ignored) { }
                try {
                    Map<String, Object> cfg = new TreeMap<>();
                    for (ConfigEntry ce : r.config(t).get().entries()) cfg.put(ce.name(), ce.value());
                    m.put("configs", cfg);
                } catch (Exception ignored) { }
            } catch (Exception ex) {
                ok = false;
                m.put("ok", false);
                m.putAll(err(ex));
            }
            results.put(t, m);
        }
        out.put("results", results);
        out.put("ok", ok);
    }

    static void adminDelete(Admin admin, Args a, Map<String, Object> out) {
        List<String> topics = a.all("topic");
        if (topics.isEmpty()) throw new Usage("missing --topic");
        perKey(admin.deleteTopics(topics).topicNameValues(), out);
    }

    static void adminDescribe(Admin admin, Args a, Map<String, Object> out) {
        List<String> topics = a.all("topic");
        if (topics.isEmpty()) throw new Usage("missing --topic");
        Map<String, KafkaFuture<TopicDescription>> fs = admin.describeTopics(topics).topicNameValues();
        Map<String, Object> results = new LinkedHashMap<>();
        boolean ok = true;
        for (String t : topics) {
            Map<String, Object> m = new LinkedHashMap<>();
            try {
                TopicDescription d = fs.get(t).get();
                m.put("ok", true);
                m.put("name", d.name());
                m.put("internal", d.isInternal());
                m.put("topic_id", String.valueOf(d.topicId()));
                List<Object> ps = new ArrayList<>();
                for (TopicPartitionInfo pi : d.partitions()) {
                    List<Object> reps = new ArrayList<>();
                    for (Node nd : pi.replicas()) reps.add(nd.id());
                    List<Object> isr = new ArrayList<>();
                    for (Node nd : pi.isr()) isr.add(nd.id());
                    ps.add(obj("partition", pi.partition(), "leader", pi.leader() == null ? null : pi.leader().id(),
                            "replicas", reps, "isr", isr));
                }
                m.put("partitions", ps);
            } catch (Exception ex) {
                ok = false;
                m.put("ok", false);
                m.putAll(err(ex));
            }
            results.put(t, m);
        }
        out.put("results", results);
        out.put("ok", ok);
    }

    static List<ConfigResource> resources(Args a) {
        List<ConfigResource> rs = new ArrayList<>();
        for (String t : a.all("topic")) rs.add(new ConfigResource(ConfigResource.Type.TOPIC, t));
        for (String b : a.all("broker")) rs.add(new ConfigResource(ConfigResource.Type.BROKER, b));
        if (rs.isEmpty()) throw new Usage("need --topic or --broker");
        return rs;
    }

    static String resName(ConfigResource r) {
        return (r.type() == ConfigResource.Type.TOPIC ? "topic:" : "broker:") + r.name();
    }

    static void adminDescribeConfigs(Admin admin, Args a, Map<String, Object> out) {
        List<ConfigResource> rs = resources(a);
        DescribeConfigsResult r = admin.describeConfigs(rs, new DescribeConfigsOptions()
                .includeSynonyms(a.getBool("synonyms", false)).includeDocumentation(false));
        Map<String, Object> results = new LinkedHashMap<>();
        boolean ok = true;
        for (ConfigResource cr : rs) {
            Map<String, Object> m = new LinkedHashMap<>();
            try {
                Config c = r.values().get(cr).get();
                Map<String, Object> entries = new TreeMap<>();
                for (ConfigEntry ce : c.entries()) {
                    entries.put(ce.name(), obj("value", ce.value(), "source", ce.source().name(),
                            "read_only", ce.isReadOnly(), "sensitive", ce.isSensitive(),
                            "type", ce.type() == null ? null : ce.type().name()));
                }
                m.put("ok", true);
                m.put("configs", entries);
            } catch (Exception ex) {
                ok = false;
                m.put("ok", false);
                m.putAll(err(ex));
            }
            results.put(resName(cr), m);
        }
        out.put("results", results);
        out.put("ok", ok);
    }

    static void adminAlterConfigs(Admin admin, Args a, Map<String, Object> out) {
        List<ConfigResource> rs = resources(a);
        List<AlterConfigOp> ops = new ArrayList<>();
        for (Map.Entry<String, String> e : a.kv("set").entrySet()) {
            ops.add(new AlterConfigOp(new ConfigEntry(e.getKey(), e.getValue()), AlterConfigOp.OpType.SET));
        }
        for (String k : a.all("delete")) {
            ops.add(new AlterConfigOp(new ConfigEntry(k, null), AlterConfigOp.OpType.DELETE));
        }
        Map<ConfigResource, Collection<AlterConfigOp>> req = new LinkedHashMap<>();
        for (ConfigResource cr : rs) req.put(cr, ops);
        Map<ConfigResource, KafkaFuture<Void>> fs = admin.incrementalAlterConfigs(req,
                new AlterConfigsOptions().validateOnly(a.getBool("validate-only", false))).values();
        Map<String, KafkaFuture<Void>> named = new LinkedHashMap<>();
        for (Map.Entry<ConfigResource, KafkaFuture<Void>> e : fs.entrySet()) named.put(resName(e.getKey()), e.getValue());
        perKey(named, out);
    }

    static void adminListOffsets(Admin admin, Args a, Map<String, Object> out) throws Exception {
        String spec = a.get("spec", "latest");
        OffsetSpec os;
        switch (spec) {
            case "earliest": os = OffsetSpec.earliest(); break;
            case "latest": os = OffsetSpec.latest(); break;
            case "max-timestamp": os = OffsetSpec.maxTimestamp(); break;
            default: os = OffsetSpec.forTimestamp(Long.parseLong(spec));
        }
        Map<TopicPartition, OffsetSpec> req = new LinkedHashMap<>();
        for (String t : a.all("topic")) {
            TopicDescription d = admin.describeTopics(List.of(t)).topicNameValues().get(t).get();
            for (TopicPartitionInfo pi : d.partitions()) req.put(new TopicPartition(t, pi.partition()), os);
        }
        ListOffsetsResult r = admin.listOffsets(req, new ListOffsetsOptions(
                "read_committed".equals(a.get("isolation", "read_uncommitted"))
                        ? IsolationLevel.READ_COMMITTED : IsolationLevel.READ_UNCOMMITTED));
        Map<String, Object> results = new TreeMap<>();
        boolean ok = true;
        for (TopicPartition tp : req.keySet()) {
            try {
                ListOffsetsResult.ListOffsetsResultInfo info = r.partitionResult(tp).get();
                results.put(tp.toString(), obj("ok", true, "offset", info.offset(), "timestamp", info.timestamp()));
            } catch (Exception ex) {
                ok = false;
                Map<String, Object> m = obj("ok", false);
                m.putAll(err(ex));
                results.put(tp.toString(), m);
            }
        }
        out.put("results", results);
        out.put("ok", ok);
    }

    static void adminDescribeGroups(Admin admin, Args a, Map<String, Object> out) {
        List<String> groups = a.all("group");
        if (groups.isEmpty()) throw new Usage("missing --group");
        Map<String, KafkaFuture<ConsumerGroupDescription>> fs = admin.describeConsumerGroups(groups).describedGroups();
        Map<String, Object> results = new LinkedHashMap<>();
        boolean ok = true;
        for (String g : groups) {
            Map<String, Object> m = new LinkedHashMap<>();
            try {
                ConsumerGroupDescription d = fs.get(g).get();
                m.put("ok", true);
                m.put("state", String.valueOf(d.state()));
                m.put("protocol", d.partitionAssignor());
                m.put("coordinator", node(d.coordinator()));
                List<Object> members = new ArrayList<>();
                for (MemberDescription md : d.members()) {
                    List<Object> tps = new ArrayList<>();
                    for (TopicPartition tp : md.assignment().topicPartitions()) tps.add(tp.toString());
                    members.add(obj("member_id", md.consumerId(), "client_id", md.clientId(), "host", md.host(),
                            "assignment", tps));
                }
                m.put("members", members);
            } catch (Exception ex) {
                ok = false;
                m.put("ok", false);
                m.putAll(err(ex));
            }
            results.put(g, m);
        }
        out.put("results", results);
        out.put("ok", ok);
    }
}
