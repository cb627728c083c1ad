package kcl_pipeline.peer;

import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.lang.reflect.Method;
import java.net.URI;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Date;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import software.amazon.awssdk.auth.credentials.AwsBasicCredentials;
import software.amazon.awssdk.auth.credentials.StaticCredentialsProvider;
import software.amazon.awssdk.http.Protocol;
import software.amazon.awssdk.http.nio.netty.NettyNioAsyncHttpClient;
import software.amazon.awssdk.regions.Region;
import software.amazon.awssdk.services.cloudwatch.CloudWatchAsyncClient;
import software.amazon.awssdk.services.cloudwatch.CloudWatchAsyncClientBuilder;
import software.amazon.awssdk.services.dynamodb.DynamoDbAsyncClient;
import software.amazon.awssdk.services.dynamodb.DynamoDbAsyncClientBuilder;
import software.amazon.awssdk.services.kinesis.KinesisAsyncClient;
import software.amazon.awssdk.services.kinesis.KinesisAsyncClientBuilder;
import software.amazon.awssdk.services.kinesis.model.DescribeStreamSummaryRequest;
import software.amazon.awssdk.services.kinesis.model.StreamDescriptionSummary;
import software.amazon.kinesis.common.ConfigsBuilder;
import software.amazon.kinesis.common.InitialPositionInStream;
import software.amazon.kinesis.common.InitialPositionInStreamExtended;
import software.amazon.kinesis.common.StreamConfig;
import software.amazon.kinesis.common.StreamIdentifier;
import software.amazon.kinesis.coordinator.CoordinatorConfig;
import software.amazon.kinesis.coordinator.Scheduler;
import software.amazon.kinesis.exceptions.InvalidStateException;
import software.amazon.kinesis.exceptions.ShutdownException;
import software.amazon.kinesis.leases.LeaseManagementConfig;
import software.amazon.kinesis.lifecycle.events.InitializationInput;
import software.amazon.kinesis.lifecycle.events.LeaseLostInput;
import software.amazon.kinesis.lifecycle.events.ProcessRecordsInput;
import software.amazon.kinesis.lifecycle.events.ShardEndedInput;
import software.amazon.kinesis.lifecycle.events.ShutdownRequestedInput;
import software.amazon.kinesis.metrics.MetricsConfig;
import software.amazon.kinesis.metrics.MetricsLevel;
import software.amazon.kinesis.processor.FormerStreamsLeasesDeletionStrategy;
import software.amazon.kinesis.processor.MultiStreamTracker;
import software.amazon.kinesis.processor.RecordProcessorCheckpointer;
import software.amazon.kinesis.processor.ShardRecordProcessor;
import software.amazon.kinesis.processor.ShardRecordProcessorFactory;
import software.amazon.kinesis.processor.SingleStreamTracker;
import software.amazon.kinesis.processor.StreamTracker;
import software.amazon.kinesis.retrieval.KinesisClientRecord;
import software.amazon.kinesis.retrieval.RetrievalConfig;
import software.amazon.kinesis.retrieval.polling.PollingConfig;

/**
 * The real Java KCL Scheduler as a test peer of kcl_pipeline: polling retrieval against local emulators, one JSON
 * line per user record in an output file, ordinary checkpoints, graceful shutdown on SIGTERM (exit 0).
 *
 * Settings come from --name value arguments, else from the environment (PEER_NAME, upper case, dashes as
 * underscores); see usage().
 */
public final class Peer {
    private static final Logger log = LoggerFactory.getLogger(Peer.class);

    private static final String[][] OPTIONS = {
        {"stream", "stream name (repeat, or comma-separate, for a multi-stream application)"},
        {"application", "applicationName (required)"},
        {"table-name", "lease table name [default: the application name]"},
        {"worker-id", "workerIdentifier (required)"},
        {"output", "file the processor appends one JSON line per user record to (required)"},
        {"events", "file the processor appends one JSON line per lifecycle event to (optional)"},
        {"failover-millis", "failoverTimeMillis [default 10000]"},
        {"shard-sync-millis", "shardSyncIntervalMillis [default 60000]"},
        {"max-leases", "maxLeasesForWorker [default: KCL's]"},
        {"leases-to-steal", "maxLeasesToStealAtOneTime [default: KCL's]"},
        {"initial-position", "TRIM_HORIZON | LATEST | AT_TIMESTAMP [default TRIM_HORIZON]"},
        {"timestamp", "AT_TIMESTAMP: ISO-8601 instant or epoch milliseconds"},
        {"checkpoint-interval-millis", "0: checkpoint after every processRecords batch; N: at most every N ms"},
        {"idle-millis", "PollingConfig idleTimeBetweenReadsInMillis [default 200]"},
        {"max-records", "PollingConfig maxRecords [default: KCL's]"},
        {"region", "region [default AWS_REGION, else us-east-1]"},
        {"kinesis-endpoint", "[default AWS_ENDPOINT_URL_KINESIS, else AWS_ENDPOINT_URL]"},
        {"dynamodb-endpoint", "[default AWS_ENDPOINT_URL_DYNAMODB, else AWS_ENDPOINT_URL]"},
        {"cloudwatch-endpoint", "[default AWS_ENDPOINT_URL_CLOUDWATCH, else AWS_ENDPOINT_URL]"},
        {"shutdown-timeout-millis", "after SIGTERM: force the shutdown (exit 3) past this [default 30000]"},
        {"metrics", "NONE (default) | SUMMARY | DETAILED: CloudWatch metrics level"},
        {"client-version", "KCL 3.x only: 2X (CLIENT_VERSION_CONFIG_COMPATIBLE_WITH_2X) | 3X [default 3X]"},
        {"coordinator-state-table", "KCL 3.x only: coordinator state table name"},
        {"worker-metrics-table", "KCL 3.x only: worker metrics table name"},
        {"disable-worker-metrics", "KCL 3.x only: true | false"},
        {"lease-assignment-strategy", "KCL 3.x only: WORKER_UTILIZATION_AWARE | LEASE_COUNT_BASED [default: KCL's]"},
        {"lease-assignment-interval-millis", "KCL 3.x only: leaseAssignmentIntervalMillis [default 2 x failover]"},
        {"worker-metrics-reporter-millis", "KCL 3.x only: workerMetricsReporterFreqInMillis [default 30000]"},
    };

    private Peer() {
    }

    public static void main(String[] argv) throws Exception {
        Map<String, List<String>> args;
        try {
            args = parse(argv);
        } catch (IllegalArgumentException e) {
            System.err.println("kcl-peer: " + e.getMessage());
            usage();
            System.exit(2);
            return;
        }
        if (args.containsKey("help")) {
            usage();
            return;
        }
        Settings s;
        try {
            s = new Settings(args);
        } catch (IllegalArgumentException e) {
            System.err.println("kcl-peer: " + e.getMessage());
            System.exit(2);
            return;
        }
        System.exit(run(s));
    }

    static int run(Settings s) throws Exception {
        // kinesis-local answers JSON; the SDK's Kinesis client would speak CBOR.
        if (System.getProperty("aws.cborEnabled") == null) {
            System.setProperty("aws.cborEnabled", "false");
        }
        String kclVersion = kclVersion();
        log.info("kcl-peer: KCL {} worker {} application {} table {} streams {}", kclVersion, s.workerId,
                 s.application, s.tableName, s.streams);

        StaticCredentialsProvider credentials = StaticCredentialsProvider.create(AwsBasicCredentials.create(
            env("AWS_ACCESS_KEY_ID", "test"), env("AWS_SECRET_ACCESS_KEY", "test")));
        Region region = Region.of(s.region);

        KinesisAsyncClientBuilder kb = KinesisAsyncClient.builder().region(region).credentialsProvider(credentials)
            .httpClientBuilder(NettyNioAsyncHttpClient.builder().protocol(Protocol.HTTP1_1).maxConcurrency(100));
        if (s.kinesisEndpoint != null) {
            kb.endpointOverride(URI.create(s.kinesisEndpoint));
        }
        KinesisAsyncClient kinesis = kb.build();
        DynamoDbAsyncClientBuilder db = DynamoDbAsyncClient.builder().region(region).credentialsProvider(credentials)
            .httpClientBuilder(NettyNioAsyncHttpClient.builder().protocol(Protocol.HTTP1_1).maxConcurrency(100));
        if (s.dynamodbEndpoint != null) {
            db.endpointOverride(URI.create(s.dynamodbEndpoint));
        }
        DynamoDbAsyncClient dynamo = db.build();
        CloudWatchAsyncClientBuilder cb = CloudWatchAsyncClient.builder().region(region).credentialsProvider(credentials)
            .httpClientBuilder(NettyNioAsyncHttpClient.builder().protocol(Protocol.HTTP1_1));
        if (s.cloudwatchEndpoint != null) {
            cb.endpointOverride(URI.create(s.cloudwatchEndpoint));
        }
        CloudWatchAsyncClient cloudwatch = cb.build();

        Output output = new Output(s.output, s.events);
        ShardRecordProcessorFactory factory = () -> new Processor(output, s.workerId, s.checkpointIntervalMillis);

        StreamTracker tracker = tracker(s, kinesis);
        ConfigsBuilder configs = new ConfigsBuilder(tracker, s.application, kinesis, dynamo, cloudwatch, s.workerId,
                                                    factory);
        configs.tableName(s.tableName);

        LeaseManagementConfig leases = configs.leaseManagementConfig()
            .failoverTimeMillis(s.failoverMillis)
            .shardSyncIntervalMillis(s.shardSyncMillis);
        if (s.maxLeases != null) {
            leases.maxLeasesForWorker(s.maxLeases);
        }
        if (s.leasesToSteal != null) {
            leases.maxLeasesToStealAtOneTime(s.leasesToSteal);
        }

        PollingConfig polling = tracker.isMultiStream() ? new PollingConfig(kinesis)
                                                        : new PollingConfig(s.streams.get(0), kinesis);
        polling.idleTimeBetweenReadsInMillis(s.idleMillis);
        if (s.maxRecords != null) {
            polling.maxRecords(s.maxRecords);
        }
        RetrievalConfig retrieval = configs.retrievalConfig().retrievalSpecificConfig(polling);

        MetricsConfig metrics = configs.metricsConfig().metricsLevel(s.metricsLevel);

        // One CoordinatorConfig for the settings and the Scheduler: ConfigsBuilder.coordinatorConfig() makes a new one
        // at every call (settings on another instance are silently lost).
        CoordinatorConfig coordinator = configs.coordinatorConfig();
        if (kclVersion.startsWith("3.")) {
            if (s.clientVersion != null) {
                Class<?> enumType = Class.forName(
                    "software.amazon.kinesis.coordinator.CoordinatorConfig$ClientVersionConfig");
                String name = s.clientVersion.equals("2X") ? "CLIENT_VERSION_CONFIG_COMPATIBLE_WITH_2X"
                                                            : "CLIENT_VERSION_CONFIG_3X";
                invoke(coordinator, "clientVersionConfig", enumValue(enumType, name));
            }
            if (s.coordinatorStateTable != null) {
                invoke(invoke(coordinator, "coordinatorStateTableConfig"), "tableName", s.coordinatorStateTable);
            }
            Object wua = invoke(leases, "workerUtilizationAwareAssignmentConfig");
            if (s.workerMetricsTable != null) {
                invoke(invoke(wua, "workerMetricsTableConfig"), "tableName", s.workerMetricsTable);
            }
            if (s.disableWorkerMetrics != null) {
                invoke(wua, "disableWorkerMetrics", s.disableWorkerMetrics);
            }
            if (s.workerMetricsReporterMillis != null) {
                invoke(wua, "workerMetricsReporterFreqInMillis", s.workerMetricsReporterMillis.longValue());
            }
            if (s.leaseAssignmentStrategy != null) {
                Class<?> strategyType = Class.forName("software.amazon.kinesis.leases.LeaseAssignmentStrategy");
                invoke(leases, "leaseAssignmentStrategy", enumValue(strategyType, s.leaseAssignmentStrategy));
            }
            if (s.leaseAssignmentIntervalMillis != null) {
                invoke(leases, "leaseAssignmentIntervalMillis", s.leaseAssignmentIntervalMillis);
            }
        } else if (s.clientVersion != null || s.coordinatorStateTable != null || s.workerMetricsTable != null
                   || s.disableWorkerMetrics != null || s.leaseAssignmentStrategy != null
                   || s.leaseAssignmentIntervalMillis != null || s.workerMetricsReporterMillis != null) {
            System.err.println("kcl-peer: --client-version, --coordinator-state-table, --worker-metrics-table and "
                               + "--disable-worker-metrics, --lease-assignment-* need KCL 3.x (this build: " + kclVersion + ")");
            return 2;
        }

        Scheduler scheduler = new Scheduler(configs.checkpointConfig(), coordinator, leases,
                                            configs.lifecycleConfig(), metrics, configs.processorConfig(), retrieval);

        CountDownLatch stop = new CountDownLatch(1);
        String[] stopSignal = {null};
        for (String name : new String[] {"TERM", "INT"}) {
            sun.misc.Signal.handle(new sun.misc.Signal(name), sig -> {
                stopSignal[0] = sig.getName();
                stop.countDown();
            });
        }
        Thread schedulerThread = new Thread(() -> {
            try {
                scheduler.run();
            } finally {
                stop.countDown();
            }
        }, "kcl-scheduler");
        schedulerThread.start();
        output.event("started", null, "kcl=" + kclVersion);
        stop.await();
        if (stopSignal[0] == null) {
            log.error("kcl-peer: the scheduler stopped by itself");
            output.close();
            return 1;
        }
        log.info("kcl-peer: SIG{}: graceful shutdown", stopSignal[0]);
        output.event("stopping", null, "SIG" + stopSignal[0]);
        int rc = 0;
        try {
            Future<Boolean> done = scheduler.startGracefulShutdown();
            Boolean ok = done.get(s.shutdownTimeoutMillis, TimeUnit.MILLISECONDS);
            log.info("kcl-peer: graceful shutdown finished: {}", ok);
        } catch (java.util.concurrent.TimeoutException e) {
            // KCL 2.x waits for the processor of a SHARD_END lease it still holds, which never answers.
            log.warn("kcl-peer: graceful shutdown unfinished after {} ms: shutting down", s.shutdownTimeoutMillis);
            output.event("shutdownTimedOut", null, String.valueOf(s.shutdownTimeoutMillis));
            scheduler.shutdown();
            rc = 3;
        } catch (Exception e) {
            log.error("kcl-peer: graceful shutdown failed", e);
            scheduler.shutdown();
            rc = 1;
        }
        schedulerThread.join(10_000);
        output.event("stopped", null, null);
        output.close();
        return rc;
    }

    static StreamTracker tracker(Settings s, KinesisAsyncClient kinesis) throws Exception {
        InitialPositionInStreamExtended position = s.initialPosition;
        if (s.streams.size() == 1) {
            return new SingleStreamTracker(s.streams.get(0), position);
        }
        List<StreamConfig> configs = new ArrayList<>();
        for (String stream : s.streams) {
            StreamDescriptionSummary d = kinesis.describeStreamSummary(
                DescribeStreamSummaryRequest.builder().streamName(stream).build()).get().streamDescriptionSummary();
            String account = d.streamARN().split(":")[4];
            long epoch = d.streamCreationTimestamp().getEpochSecond();
            StreamIdentifier id = StreamIdentifier.multiStreamInstance(account + ":" + stream + ":" + epoch);
            configs.add(new StreamConfig(id, position));
        }
        return new MultiStreamTracker() {
            @Override
            public List<StreamConfig> streamConfigList() {
                return configs;
            }

            @Override
            public FormerStreamsLeasesDeletionStrategy formerStreamsLeasesDeletionStrategy() {
                return new FormerStreamsLeasesDeletionStrategy.NoLeaseDeletionStrategy();
            }
        };
    }

    /** One record processor per lease. */
    static final class Processor implements ShardRecordProcessor {
        private final Output output;
        private final String workerId;
        private final long checkpointIntervalMillis;
        private String shardId;
        private long lastCheckpoint;

        Processor(Output output, String workerId, long checkpointIntervalMillis) {
            this.output = output;
            this.workerId = workerId;
            this.checkpointIntervalMillis = checkpointIntervalMillis;
        }

        @Override
        public void initialize(InitializationInput input) {
            shardId = input.shardId();
            lastCheckpoint = System.currentTimeMillis();
            String at = input.extendedSequenceNumber() == null ? null : input.extendedSequenceNumber().toString();
            log.info("kcl-peer: initialize {} at {}", shardId, at);
            output.event("initialize", shardId, at);
        }

        @Override
        public void processRecords(ProcessRecordsInput input) {
            List<KinesisClientRecord> records = input.records();
            if (!records.isEmpty()) {
                long deliveredAt = System.currentTimeMillis();
                StringBuilder lines = new StringBuilder(records.size() * 200);
                for (KinesisClientRecord r : records) {
                    lines.append("{\"shard_id\":").append(quote(shardId))
                        .append(",\"sequence_number\":").append(quote(r.sequenceNumber()))
                        .append(",\"sub_sequence_number\":").append(r.subSequenceNumber())
                        .append(",\"aggregated\":").append(r.aggregated())
                        .append(",\"partition_key\":").append(quote(r.partitionKey()))
                        .append(",\"sha256\":").append(quote(sha256(r.data())))
                        .append(",\"worker_id\":").append(quote(workerId))
                        .append(",\"delivered_at_ms\":").append(deliveredAt)
                        .append("}\n");
                }
                // Written (to the OS) before the checkpoint below: a kill -9 after it loses nothing written.
                output.records(lines.toString());
            }
            long now = System.currentTimeMillis();
            if (!records.isEmpty() && now - lastCheckpoint >= checkpointIntervalMillis) {
                checkpoint(input.checkpointer(), "batch");
                lastCheckpoint = now;
            }
        }

        @Override
        public void leaseLost(LeaseLostInput input) {
            log.info("kcl-peer: lease lost {}", shardId);
            output.event("leaseLost", shardId, null);
        }

        @Override
        public void shardEnded(ShardEndedInput input) {
            log.info("kcl-peer: shard ended {}", shardId);
            checkpoint(input.checkpointer(), "shardEnded");
            output.event("shardEnded", shardId, null);
        }

        @Override
        public void shutdownRequested(ShutdownRequestedInput input) {
            log.info("kcl-peer: shutdown requested {}", shardId);
            checkpoint(input.checkpointer(), "shutdownRequested");
            output.event("shutdownRequested", shardId, null);
        }

        private void checkpoint(RecordProcessorCheckpointer checkpointer, String why) {
            try {
                checkpointer.checkpoint();
            } catch (ShutdownException e) {
                log.info("kcl-peer: checkpoint ({}) of {} refused: {}", why, shardId, e.getMessage());
                output.event("checkpointRefused", shardId, why);
            } catch (InvalidStateException e) {
                log.error("kcl-peer: checkpoint ({}) of {} failed", why, shardId, e);
                output.event("checkpointFailed", shardId, why);
            } catch (Exception e) {
                log.error("kcl-peer: checkpoint ({}) of {} failed", why, shardId, e);
                output.event("checkpointFailed", shardId, why);
            }
        }
    }

    /** The record and event files: appended by every processor, each write flushed to the OS at once. */
    static final class Output {
        private final OutputStream records;
        private final OutputStream events;

        Output(String recordsPath, String eventsPath) throws IOException {
            records = new FileOutputStream(recordsPath, true);
            events = eventsPath == null ? null : new FileOutputStream(eventsPath, true);
        }

        synchronized void records(String lines) {
            try {
                records.write(lines.getBytes(StandardCharsets.UTF_8));
                records.flush();
            } catch (IOException e) {
                throw new RuntimeException("kcl-peer: cannot write the output file", e);
            }
        }

        synchronized void event(String event, String shardId, String detail) {
            if (events == null) {
                return;
            }
            String line = "{\"event\":" + quote(event) + ",\"shard_id\":" + quote(shardId) + ",\"detail\":"
                + quote(detail) + ",\"time\":" + (System.currentTimeMillis() / 1000.0) + "}\n";
            try {
                events.write(line.getBytes(StandardCharsets.UTF_8));
                events.flush();
            } catch (IOException e) {
                throw new RuntimeException("kcl-peer: cannot write the events file", e);
            }
        }

        synchronized void close() throws IOException {
            records.close();
            if (events != null) {
                events.close();
            }
        }
    }

    /** The settings, from arguments or the environment. */
    static final class Settings {
        final List<String> streams = new ArrayList<>();
        final String application;
        final String tableName;
        final String workerId;
        final String output;
        final String events;
        final long failoverMillis;
        final long shardSyncMillis;
        final Integer maxLeases;
        final Integer leasesToSteal;
        final InitialPositionInStreamExtended initialPosition;
        final long checkpointIntervalMillis;
        final long idleMillis;
        final Integer maxRecords;
        final String region;
        final String kinesisEndpoint;
        final String dynamodbEndpoint;
        final String cloudwatchEndpoint;
        final MetricsLevel metricsLevel;
        final String clientVersion;
        final String coordinatorStateTable;
        final String workerMetricsTable;
        final Boolean disableWorkerMetrics;
        final String leaseAssignmentStrategy;
        final Long leaseAssignmentIntervalMillis;
        final Long workerMetricsReporterMillis;
        final long shutdownTimeoutMillis;

        Settings(Map<String, List<String>> args) {
            for (String v : all(args, "stream")) {
                for (String part : v.split(",")) {
                    if (!part.isBlank()) {
                        streams.add(part.trim());
                    }
                }
            }
            if (streams.isEmpty()) {
                throw new IllegalArgumentException("--stream is required");
            }
            application = required(args, "application");
            tableName = one(args, "table-name", application);
            workerId = required(args, "worker-id");
            output = required(args, "output");
            events = one(args, "events", null);
            failoverMillis = Long.parseLong(one(args, "failover-millis", "10000"));
            shardSyncMillis = Long.parseLong(one(args, "shard-sync-millis", "60000"));
            maxLeases = integer(one(args, "max-leases", null));
            leasesToSteal = integer(one(args, "leases-to-steal", null));
            String position = one(args, "initial-position", "TRIM_HORIZON").toUpperCase();
            switch (position) {
                case "TRIM_HORIZON":
                    initialPosition = InitialPositionInStreamExtended.newInitialPosition(
                        InitialPositionInStream.TRIM_HORIZON);
                    break;
                case "LATEST":
                    initialPosition = InitialPositionInStreamExtended.newInitialPosition(InitialPositionInStream.LATEST);
                    break;
                case "AT_TIMESTAMP":
                    initialPosition = InitialPositionInStreamExtended.newInitialPositionAtTimestamp(
                        timestamp(required(args, "timestamp")));
                    break;
                default:
                    throw new IllegalArgumentException("--initial-position: TRIM_HORIZON, LATEST or AT_TIMESTAMP");
            }
            checkpointIntervalMillis = Long.parseLong(one(args, "checkpoint-interval-millis", "0"));
            idleMillis = Long.parseLong(one(args, "idle-millis", "200"));
            maxRecords = integer(one(args, "max-records", null));
            region = one(args, "region", env("AWS_REGION", env("AWS_DEFAULT_REGION", "us-east-1")));
            String common = env("AWS_ENDPOINT_URL", null);
            kinesisEndpoint = one(args, "kinesis-endpoint", env("AWS_ENDPOINT_URL_KINESIS", common));
            dynamodbEndpoint = one(args, "dynamodb-endpoint", env("AWS_ENDPOINT_URL_DYNAMODB", common));
            cloudwatchEndpoint = one(args, "cloudwatch-endpoint", env("AWS_ENDPOINT_URL_CLOUDWATCH", common));
            metricsLevel = MetricsLevel.valueOf(one(args, "metrics", "NONE").toUpperCase());
            String cv = one(args, "client-version", null);
            if (cv != null) {
                cv = cv.toUpperCase();
                if (!cv.equals("2X") && !cv.equals("3X")) {
                    throw new IllegalArgumentException("--client-version: 2X or 3X");
                }
            }
            clientVersion = cv;
            coordinatorStateTable = one(args, "coordinator-state-table", null);
            workerMetricsTable = one(args, "worker-metrics-table", null);
            String dwm = one(args, "disable-worker-metrics", null);
            disableWorkerMetrics = dwm == null ? null : Boolean.valueOf(dwm);
            String las = one(args, "lease-assignment-strategy", null);
            leaseAssignmentStrategy = las == null ? null : las.toUpperCase();
            String lai = one(args, "lease-assignment-interval-millis", null);
            leaseAssignmentIntervalMillis = lai == null ? null : Long.valueOf(lai);
            String wmr = one(args, "worker-metrics-reporter-millis", null);
            workerMetricsReporterMillis = wmr == null ? null : Long.valueOf(wmr);
            shutdownTimeoutMillis = Long.parseLong(one(args, "shutdown-timeout-millis", "30000"));
        }

        private static Date timestamp(String value) {
            if (value.matches("\\d+")) {
                return new Date(Long.parseLong(value));
            }
            return Date.from(Instant.parse(value));
        }

        private static Integer integer(String value) {
            return value == null ? null : Integer.valueOf(value);
        }

        private static List<String> all(Map<String, List<String>> args, String name) {
            List<String> values = args.get(name);
            if (values != null) {
                return values;
            }
            String fromEnv = System.getenv(envName(name));
            return fromEnv == null ? List.of() : List.of(fromEnv);
        }

        private static String one(Map<String, List<String>> args, String name, String fallback) {
            List<String> values = all(args, name);
            return values.isEmpty() ? fallback : values.get(values.size() - 1);
        }

        private static String required(Map<String, List<String>> args, String name) {
            String value = one(args, name, null);
            if (value == null || value.isEmpty()) {
                throw new IllegalArgumentException("--" + name + " (or " + envName(name) + ") is required");
            }
            return value;
        }

        private static String envName(String option) {
            return "PEER_" + option.toUpperCase().replace('-', '_');
        }
    }

    static Map<String, List<String>> parse(String[] argv) {
        Map<String, List<String>> args = new HashMap<>();
        for (int i = 0; i < argv.length; i++) {
            String a = argv[i];
            if (a.equals("-h") || a.equals("--help")) {
                args.put("help", List.of());
                continue;
            }
            if (!a.startsWith("--")) {
                throw new IllegalArgumentException("unexpected argument " + a);
            }
            String name = a.substring(2);
            String value;
            int eq = name.indexOf('=');
            if (eq >= 0) {
                value = name.substring(eq + 1);
                name = name.substring(0, eq);
            } else {
                if (i + 1 >= argv.length) {
                    throw new IllegalArgumentException("--" + name + " needs a value");
                }
                value = argv[++i];
            }
            boolean known = false;
            for (String[] o : OPTIONS) {
                known |= o[0].equals(name);
            }
            if (!known) {
                throw new IllegalArgumentException("unknown option --" + name);
            }
            args.computeIfAbsent(name, k -> new ArrayList<>()).add(value);
        }
        return args;
    }

    static void usage() {
        StringBuilder b = new StringBuilder("usage: java -cp kcl-peer.jar:<classpath> kcl_pipeline.peer.Peer "
                                            + "--name value ... (or PEER_NAME in the environment)\n");
        for (String[] o : OPTIONS) {
            b.append(String.format("  --%-28s %s%n", o[0], o[1]));
        }
        System.err.print(b);
    }

    static String kclVersion() {
        Package p = Scheduler.class.getPackage();
        String v = p == null ? null : p.getImplementationVersion();
        if (v == null) {
            v = Peer.class.getPackage() == null ? null : Peer.class.getPackage().getImplementationVersion();
        }
        if (v == null) {
            try {
                Class.forName("software.amazon.kinesis.coordinator.CoordinatorConfig$ClientVersionConfig");
                v = "3.x";
            } catch (ClassNotFoundException e) {
                v = "2.x";
            }
        }
        return v;
    }

    static Object invoke(Object target, String name, Object... args) throws Exception {
        for (Method m : target.getClass().getMethods()) {
            if (m.getName().equals(name) && m.getParameterCount() == args.length) {
                return m.invoke(target, args);
            }
        }
        throw new NoSuchMethodException(target.getClass().getName() + "." + name);
    }

    @SuppressWarnings({"unchecked", "rawtypes"})
    static Object enumValue(Class<?> type, String name) {
        return Enum.valueOf((Class) type, name);
    }

    static String env(String name, String fallback) {
        String v = System.getenv(name);
        return v == null || v.isEmpty() ? fallback : v;
    }

    static String sha256(ByteBuffer data) {
        try {
            MessageDigest md = MessageDigest.getInstance("SHA-256");
            md.update(data.duplicate());
            StringBuilder hex = new StringBuilder(64);
            for (byte x : md.digest()) {
                hex.append(Character.forDigit((x >> 4) & 0xf, 16)).append(Character.forDigit(x & 0xf, 16));
            }
            return hex.toString();
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }

    static String quote(String s) {
        if (s == null) {
            return "null";
        }
        StringBuilder b = new StringBuilder(s.length() + 2).append('"');
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                default:
                    if (c < 0x20) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
            }
        }
        return b.append('"').toString();
    }
}
