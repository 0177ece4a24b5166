// Command cmd is the pipeline benchmark harness that scripts/bench.sh runs
// (`make bench`): one scenario per process, so that each one's RSS and heap
// are its own, printing one JSON line per result on stdout.
//
//	go run ./internal/bench/cmd -scenario consumer -brokers 127.0.0.1:19092 -redis 127.0.0.1:16379
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	_ "net/http/pprof"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kfpipe/kfpipe/internal/bench"
	"github.com/kfpipe/kfpipe/internal/config"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run() error {
	scenario := flag.String("scenario", "", "producer|consumer|paced|peer|replies|e2e|memory|isolation|state|archive")
	archiveDSN := flag.String("archive-dsn", os.Getenv("KFPIPE_TEST_POSTGRES"), "archive scenario: the PostgreSQL to write to (a schema of the run's own)")
	days := flag.Int("days", 7, "archive scenario: day partitions the messages' send times spread over")
	archiveBeside := flag.Bool("archive-beside", true, "archive scenario: run the schedule-consumer's pipeline over the same topic while the archiver writes")
	archiveBulk := flag.Int("archive-bulk", 20_000_000, "archive scenario: rows the server puts in the archive (generate_series) before the archiver's messages are measured on top")
	pcJar := flag.String("pc-jar", ".run/bench/pc-peer.jar", "peer scenario: the Parallel Consumer runner (bench/pc-peer)")
	pcConcurrency := flag.Int("pc-concurrency", 16, "peer scenario: the Parallel Consumer's max concurrency")
	brokers := flag.String("brokers", envOr("KFPIPE_TEST_KAFKA", "127.0.0.1:19092"), "Kafka bootstrap servers")
	redisAddr := flag.String("redis", envOr("KFPIPE_TEST_REDIS", "127.0.0.1:16379"), "Redis address")
	redisCluster := flag.String("redis-cluster", os.Getenv("KFPIPE_TEST_REDIS_CLUSTER"), "state scenario: a Redis Cluster's comma-separated seed addresses; the workloads of -cluster-workloads run on it too (none when empty)")
	clusterWorkloads := flag.String("cluster-workloads", "dense", "state scenario: comma-separated workloads that also run on -redis-cluster, at the same size and on the same messages as their single-Redis rows (\"\" for none)")
	msgs := flag.Int("msgs", 0, "messages (0 = the scenario's default)")
	users := flag.Int("users", 0, "users (0 = the scenario's default)")
	partitions := flag.Int("partitions", 4, "partitions of the consumer scenario's topic")
	duration := flag.Duration("duration", 0, "paced scenarios' run time (0 = default)")
	variant := flag.String("variant", "", "consumer scenario diagnostics: no_limiter | no_overload (overload.max_in_flight=0: no limit on handler calls) | no_flush_wait (processor.pipeline_flush=0) | bare (no dedup, limiter, breaker)")
	pprofAddr := flag.String("pprof", "", "serve net/http/pprof on this loopback address while running")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the scenario to this file")
	logLevel := flag.String("log-level", "error", "log level of the scenario's components (debug shows librdkafka's debug lines, see -kafka-set debug=...)")
	var kafkaSet kvFlags
	flag.Var(&kafkaSet, "kafka-set", "extra librdkafka property key=value for every client (repeatable), e.g. debug=eos,metadata")
	memProfile := flag.String("memprofile", "", "write an allocation profile (every allocation since start) to this file at the end")
	workloads := flag.String("workloads", "", "state scenario: comma-separated workloads of dense, conversation, write-once, journey (default all)")
	noOld := flag.Bool("no-old", false, "state scenario: skip the full pipeline, run the store-level phase only")
	legacy := flag.String("legacy", "off", "state scenario: comma-separated dedup.legacy modes the full pipeline runs with in turn (off, read)")
	guardResults := flag.String("guard", "", "compare this results file (JSON lines of a run) with -baseline, print the change a row and exit 3 when a row is worse by more than 20%; runs no scenario")
	baselinePath := flag.String("baseline", "bench/baseline.json", "-guard: the committed file of accepted figures")
	accept := flag.String("accept", "", "-guard: fold the results into -baseline as the accepted figures, with this text as their source (date, commit, command, load)")
	fakeAccount := flag.String("fake-account", "", "replies-fake (the replies scenario's child, its fake WeChat): the open_kfid it serves")
	pacedTopic := flag.String("paced-topic", "", "paced-peer (the paced scenario's child): the topic to feed")
	pacedGaps := flag.String("paced-gaps", "15s,40s", "paced scenario: a customer's pause between two messages, min,max")
	pacedIdle := flag.Duration("paced-idle", 15*time.Second, "paced scenario: the quiet period the consumer's idle CPU is measured over")
	flag.Parse()
	if *guardResults != "" {
		return guard(*guardResults, *baselinePath, *accept)
	}
	minGap, maxGap, err := gaps(*pacedGaps)
	if err != nil {
		return err
	}
	if *scenario == "replies-fake" {
		return bench.ReplyFake(*fakeAccount, *users, os.Stdin, os.Stdout)
	}
	if *scenario == "paced-peer" {
		return bench.PacedPeer(*brokers, *pacedTopic, *users, *duration, minGap, maxGap, *pacedIdle, os.Stdin, os.Stdout)
	}

	logCfg := zap.NewProductionConfig()
	lvl, err := zapcore.ParseLevel(*logLevel)
	if err != nil {
		return err
	}
	logCfg.Level = zap.NewAtomicLevelAt(lvl)
	logCfg.OutputPaths = []string{"stderr"}
	log, err := logCfg.Build()
	if err != nil {
		return err
	}
	e, err := bench.NewEnv(*brokers, *redisAddr, log)
	if err != nil {
		return err
	}
	defer e.Close()
	e.KafkaOverrides = kafkaSet.m
	if *pprofAddr != "" {
		go func() { _ = http.ListenAndServe(*pprofAddr, nil) }()
	}
	// The consumer scenario profiles its pipeline phase only (the
	// allocation profile of the whole run is written with a ".base" one
	// taken as the phase starts: `go tool pprof -base F.base F`); the
	// others the whole run.
	if *memProfile != "" {
		runtime.MemProfileRate = 64 << 10
		defer writeAllocs(*memProfile)
	}
	var profile func() (stop func())
	if *cpuProfile != "" || *memProfile != "" {
		var f *os.File
		if *cpuProfile != "" {
			if f, err = os.Create(*cpuProfile); err != nil {
				return err
			}
			defer f.Close()
		}
		profile = func() func() {
			if *memProfile != "" {
				writeAllocs(*memProfile + ".base")
			}
			if f == nil {
				return func() {}
			}
			if err := pprof.StartCPUProfile(f); err != nil {
				fmt.Fprintln(os.Stderr, "cpu profile:", err)
				return func() {}
			}
			return pprof.StopCPUProfile
		}
		if *scenario != "consumer" {
			defer profile()()
		}
	}

	or := func(v, def int) int {
		if v > 0 {
			return v
		}
		return def
	}
	ord := func(v, def time.Duration) time.Duration {
		if v > 0 {
			return v
		}
		return def
	}
	var results []bench.Result
	switch *scenario {
	case "paced":
		self, serr := os.Executable()
		if serr != nil {
			return serr
		}
		var r bench.Result
		r, err = bench.Paced(e, bench.PacedOptions{Users: or(*users, 3000), Partitions: *partitions,
			Duration: ord(*duration, 90*time.Second), MinGap: minGap, MaxGap: maxGap, Idle: *pacedIdle, Self: self})
		results = []bench.Result{r}
	case "producer":
		results, err = bench.Producer(e, bench.ProducerOptions{Msgs: or(*msgs, 300000), Streams: 4, Page: 1000})
	case "consumer":
		var r bench.Result
		r, err = bench.Consumer(e, bench.ConsumerOptions{Msgs: or(*msgs, 300000), Users: or(*users, 10000), Partitions: *partitions, Bare: *variant == "bare",
			Profile: profile,
			Mutate: func(c *config.Consumer) {
				switch *variant {
				case "no_limiter":
					c.RateLimit.Enabled = false
				case "no_flush_wait":
					c.Processor.PipelineFlush = 0
				case "no_overload":
					c.Overload.MaxInFlight = 0
				}
			}})
		if err == nil && *variant != "" {
			r.Extra["variant"] = *variant
		}
		results = []bench.Result{r}
	case "peer":
		results, err = bench.Peer(e, bench.PeerOptions{Msgs: or(*msgs, 300000), Users: or(*users, 10000), Partitions: *partitions,
			Jar: *pcJar, Concurrency: *pcConcurrency})
	case "replies":
		var r bench.Result
		r, err = bench.Replies(e, bench.ConsumerOptions{Msgs: or(*msgs, 20000), Users: or(*users, 2000), Partitions: *partitions})
		results = []bench.Result{r}
	case "e2e":
		var r bench.Result
		r, err = bench.E2ELatency(e, float64(or(*msgs, 5000)), ord(*duration, 20*time.Second), or(*users, 1000))
		results = []bench.Result{r}
	case "memory":
		var r bench.Result
		r, err = bench.Memory(e, or(*users, 100000), ord(*duration, 45*time.Second))
		results = []bench.Result{r}
	case "state":
		var wls, cls []string
		if *workloads != "" {
			wls = strings.Split(*workloads, ",")
		}
		if *redisCluster != "" && *clusterWorkloads != "" {
			if cls, err = clusterRun(*clusterWorkloads, wls); err != nil {
				return err
			}
			if err = e.ConnectCluster(strings.Split(*redisCluster, ",")); err != nil {
				return fmt.Errorf("-redis-cluster: %w", err)
			}
		}
		results, err = bench.State(e, bench.StateOptions{Msgs: or(*msgs, 1000000), Users: or(*users, 10000), Partitions: *partitions,
			Workloads: wls, NoOld: *noOld, Legacy: strings.Split(*legacy, ","), Cluster: cls})
	case "isolation":
		var r bench.Result
		r, err = bench.Isolation(e, or(*users, 1000), 10, ord(*duration, 30*time.Second))
		results = []bench.Result{r}
	case "archive":
		var r bench.Result
		r, err = bench.Archive(e, bench.ArchiveOptions{DSN: *archiveDSN, Msgs: or(*msgs, 300000), Users: or(*users, 100000),
			Partitions: *partitions, Days: *days, Queries: 200, Bulk: *archiveBulk, Beside: *archiveBeside})
		results = []bench.Result{r}
	default:
		return fmt.Errorf("-scenario must be one of producer, consumer, peer, replies, e2e, memory, isolation, state, archive; got %q", *scenario)
	}
	enc := json.NewEncoder(os.Stdout)
	for _, r := range results {
		if eerr := enc.Encode(r); eerr != nil {
			return eerr
		}
	}
	return err
}

// clusterRun checks -cluster-workloads against the workloads the run has
// (-workloads; every one when empty).
func clusterRun(flagValue string, run []string) ([]string, error) {
	if len(run) == 0 {
		run = []string{bench.WorkloadDense, bench.WorkloadConversation, bench.WorkloadWriteOnce}
	}
	var out []string
	for _, w := range strings.Split(flagValue, ",") {
		if !slices.Contains(run, w) {
			return nil, fmt.Errorf("-cluster-workloads: %q is not a workload of this run (%s)", w, strings.Join(run, ", "))
		}
		out = append(out, w)
	}
	return out, nil
}

// writeAllocs writes the allocation profile (every allocation so far).
func writeAllocs(path string) {
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "allocation profile:", err)
		return
	}
	defer f.Close()
	runtime.GC() // the profile shows allocations as of the last GC
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		fmt.Fprintln(os.Stderr, "allocation profile:", err)
	}
}

// guard is the regression guard's run (make bench's last step): see
// bench.Compare.
func guard(resultsPath, baselinePath, accept string) error {
	f, err := os.Open(resultsPath)
	if err != nil {
		return err
	}
	defer f.Close()
	results, err := bench.ReadResults(f)
	if err != nil {
		return fmt.Errorf("%s: %w", resultsPath, err)
	}
	base, err := bench.ReadBaseline(baselinePath)
	if err != nil {
		return err
	}
	rows, notRun := bench.Compare(base, results)
	worse := bench.PrintComparison(os.Stdout, base, rows, notRun)
	if accept != "" {
		if err := bench.WriteBaseline(baselinePath, bench.Accept(base, results, accept)); err != nil {
			return err
		}
		fmt.Printf("regression guard: %d rows accepted into %s\n", len(results), baselinePath)
		return nil
	}
	if worse > 0 {
		os.Exit(3)
	}
	return nil
}

// gaps reads -paced-gaps ("min,max").
func gaps(v string) (time.Duration, time.Duration, error) {
	lo, hi, ok := strings.Cut(v, ",")
	if !ok {
		return 0, 0, fmt.Errorf("-paced-gaps %q: want min,max (e.g. 15s,40s)", v)
	}
	lo2, err := time.ParseDuration(lo)
	if err != nil {
		return 0, 0, fmt.Errorf("-paced-gaps: %w", err)
	}
	hi2, err := time.ParseDuration(hi)
	if err != nil {
		return 0, 0, fmt.Errorf("-paced-gaps: %w", err)
	}
	if lo2 <= 0 || hi2 < lo2 {
		return 0, 0, fmt.Errorf("-paced-gaps %q: want 0 < min <= max", v)
	}
	return lo2, hi2, nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// kvFlags collects repeated key=value flags.
type kvFlags struct{ m map[string]string }

func (f *kvFlags) String() string { return fmt.Sprint(f.m) }

func (f *kvFlags) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want key=value, got %q", s)
	}
	if f.m == nil {
		f.m = map[string]string{}
	}
	f.m[k] = v
	return nil
}
