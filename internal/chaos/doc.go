// Package chaos is the fault-injection suite: it runs the real daemons
// (kf-producer, schedule-consumer, dlq-consumer) as separate processes
// against real Kafka and Redis, pushes a known set of messages through them
// from the fake WeChat, injects a fault, and then judges the outcome from
// evidence the daemons do not control:
//
//   - the Sink, an HTTP server in the test process that the consumers'
//     http handler posts every message to (it records upstream msgid,
//     user, time and which daemon incarnation delivered it);
//   - the DLQ index, read through the dlq-consumer's admin API;
//   - a kcat dump of the main topic (keys and headers).
//
// Every scenario ends with one line,
//
//	scenario=<name> sent=N effects=N dlq=N lost=0 dup=0 reordered=0 duration=… [key=value…]
//
// printed with t.Log and on stdout, and fails unless lost, dup and
// reordered are all 0. See docs/reliability.md for what each count means,
// in particular how a redelivery inside the at-least-once window of a
// killed consumer (redelivered_after_kill) is told from a duplicate.
//
// # Adding a scenario
//
// A scenario is a test function named TestChaos… in this package:
//
//  1. svc := NeedServices(t) gives the shared Kafka and Redis (fails under
//     CI, skips otherwise). For a fault on a service, start a private one
//     with PrivateRedis / PrivateKafka (scripts/redis.sh, scripts/kafka.sh
//     under a temporary run directory) and pass its address in Options.
//  2. p := Start(t, Options{…}) starts the three daemons with random
//     topics, key prefix, groups and ports; p.Producer, p.Consumers[i] and
//     p.DLQ are Daemons with Kill9, Stop, Start, Restart and Readyz. Every
//     process is killed at test cleanup; its logs (one file per
//     incarnation under t.TempDir) are tailed when the test failed.
//  3. Run(t, name, p, Load{Total, Users, Rate}, settle, fault) feeds known
//     messages into the fake WeChat (Feeder: appended to the log, announced
//     with signed callbacks) while fault runs; fault injects and repairs
//     (Kill9/Restart a Daemon, Node.Kill9/Resume, p.OnSyncMsg to aim at a
//     moment of the sync) and records observations on its *Report with
//     Extra and Problem. Run then waits until every message has an effect
//     or a dead letter plus a quiet period (Pipeline.Settle), collects the
//     evidence (Pipeline.Collect), stops the daemons with SIGTERM (a hang is
//     a problem), and calls Finish, which prints the line and fails the
//     test unless it is clean.
//  4. For another shape of run, use the parts directly: NewFeeder and
//     Feed, Settle, Collect, Evidence.Report, Finish.
//
// Full-size runs are behind KFPIPE_CHAOS_FULL=1 (scripts/chaos.sh sets it);
// use Size(reduced, full) to pick parameters and SkipUnlessFull for
// scenarios that only run in the full suite.
//
// # The nemesis
//
// TestChaosNemesis combines what the scenarios inject one at a time: a
// seeded random schedule (GenSchedule, a pure function of the seed,
// printed before the run) of daemon kills, SIGTERMs, freezes, scale-out
// and scale-in, Redis delay, resets and cuts through the fault proxy, a
// slow or flaky receiver, a failing customer or everyone, an operator's
// batch retry, WeChat throttles and a servicer's hold on replies (95018),
// sync throttles, floods, bursts, slow handlers and, in the full run,
// broker kills and stops on a private 3-node cluster — over dense,
// conversation-paced and write-once traffic with replies. One checker
// (Check) judges the whole run and prints its verdict line,
//
//	nemesis seed=N verdict: lost=0 dup=0 reordered=0 replies_dup=0 … | messages=… faults=… [kind:n,…]
//
// and, on a violation, the first ones, the replay command and the
// schedule. make test runs 3 minutes of ShortKinds with seed 48; make
// chaos 30 minutes of every kind with a fresh seed, and 10 minutes on
// Redis Sentinel (KFPIPE_NEMESIS_SEED, KFPIPE_NEMESIS_DURATION,
// KFPIPE_NEMESIS_KINDS, KFPIPE_NEMESIS_KAFKA and KFPIPE_NEMESIS_REDIS
// replay and minimize; ReplayCommand prints the one make chaos command).
package chaos
