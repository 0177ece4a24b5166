package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kfpipe/kfpipe/internal/bench"
	"github.com/kfpipe/kfpipe/internal/chatmsg"
)

// writeExpect writes users a and b with n messages each, a's first.
func writeExpect(t *testing.T, dir string, n int) (string, []expectLine) {
	t.Helper()
	path := filepath.Join(dir, "expect.jsonl")
	w, err := createExpect(path)
	if err != nil {
		t.Fatal(err)
	}
	var lines []expectLine
	t0 := time.Now().Add(-time.Minute)
	for i := range n {
		for _, u := range []string{"a", "b"} {
			l := expectLine{Run: "r1", MsgID: u + "-" + string(rune('0'+i)), User: u, Index: i, At: t0.Add(time.Duration(i) * time.Second)}
			w.add(l)
			lines = append(lines, l)
		}
	}
	if err := w.close(); err != nil {
		t.Fatal(err)
	}
	return path, lines
}

// deliver posts msgids to a real bench.Sink writing a record file, in
// order, and returns the record's path.
func deliver(t *testing.T, dir string, so bench.SinkOptions, msgids ...string) string {
	t.Helper()
	path := filepath.Join(dir, "record.jsonl")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	so.Record = f
	s := bench.NewSink(nil, so)
	srv := httptest.NewServer(s.Handler())
	for _, id := range msgids {
		body, _ := chatmsg.Encode(&chatmsg.ChatMessage{UpstreamMsgID: id, OpenKfID: "wk", ExternalUserID: id[:1]})
		resp, err := http.Post(srv.URL+"/sink", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	srv.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	return path
}

func check(t *testing.T, args ...string) (checkResult, string, error) {
	t.Helper()
	var out, errb strings.Builder
	err := runCheck(context.Background(), args, &out, &errb)
	var res checkResult
	if out.Len() > 0 {
		if jerr := json.Unmarshal([]byte(out.String()), &res); jerr != nil {
			t.Fatalf("output %q: %v", out.String(), jerr)
		}
	}
	return res, errb.String(), err
}

// TestExpectCheckRoundTrip: an expected set written by the run's writer
// and a record written by the real sink are read back by check, which
// finds what is wrong with the record and nothing when nothing is.
func TestExpectCheckRoundTrip(t *testing.T) {
	tests := []struct {
		name      string
		delivered []string
		want      runVerdict
	}{
		{name: "clean", delivered: []string{"a-0", "b-0", "a-1", "b-1", "a-2", "b-2"}, want: runVerdict{Effects: 6, OK: true}},
		{name: "lost", delivered: []string{"a-0", "b-0", "a-1", "b-1", "a-2"}, want: runVerdict{Effects: 5, Lost: 1}},
		{name: "duplicate", delivered: []string{"a-0", "b-0", "a-1", "b-1", "b-1", "a-2", "b-2"}, want: runVerdict{Effects: 6, Dup: 1}},
		{name: "reordered", delivered: []string{"a-0", "b-0", "a-2", "a-1", "b-1", "b-2"}, want: runVerdict{Effects: 6, Reordered: 1}},
		{name: "other traffic is not judged", delivered: []string{"a-0", "b-0", "x-9", "a-1", "b-1", "a-2", "b-2"},
			want: runVerdict{Effects: 6, OK: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			exp, _ := writeExpect(t, dir, 3)
			rec := deliver(t, dir, bench.SinkOptions{}, tt.delivered...)
			res, stderr, err := check(t, "--expect", exp, "--record", rec, "--dlq", "none")
			if (err == nil) != tt.want.OK || res.OK != tt.want.OK || len(res.Runs) != 1 {
				t.Fatalf("err %v, result %+v\n%s", err, res, stderr)
			}
			got := res.Runs[0]
			if got.Run != "r1" || got.Sent != 6 || got.Effects != tt.want.Effects || got.Lost != tt.want.Lost ||
				got.Dup != tt.want.Dup || got.Reordered != tt.want.Reordered {
				t.Fatalf("verdict %+v, want %+v", got, tt.want)
			}
			if !strings.Contains(stderr, "run=r1 sent=6") {
				t.Fatalf("no summary line: %s", stderr)
			}
		})
	}
}

// TestCheckRecordOfAFailingSink: the messages a failing sink answered 500
// are no effect in its record, and check finds them missing.
func TestCheckRecordOfAFailingSink(t *testing.T) {
	dir := t.TempDir()
	exp, _ := writeExpect(t, dir, 2)
	rec := deliver(t, dir, bench.SinkOptions{FailUsers: []string{"a"}}, "a-0", "b-0", "a-1", "b-1")
	res, _, err := check(t, "--expect", exp, "--record", rec, "--dlq", "none")
	if err == nil || res.OK || res.Runs[0].Lost != 2 || res.Runs[0].Effects != 2 {
		t.Fatalf("a failing user's messages must be missing from the record: %v %+v", err, res)
	}
}

func TestJudgeRunsDeadLetters(t *testing.T) {
	_, expected := writeExpect(t, t.TempDir(), 2)
	at := func(i int) time.Time { return expected[0].At.Add(time.Duration(i) * time.Second) }
	all := []bench.RecordLine{{MsgID: "a-0", User: "a", At: at(1)}, {MsgID: "b-0", User: "b", At: at(1)},
		{MsgID: "b-1", User: "b", At: at(2)}}
	recovered := append(all, bench.RecordLine{MsgID: "a-1", User: "a", At: at(40)})
	dead := map[string][]string{"a-1": {"downstream_error"}, "zz": {"rate_limited"}}
	tests := []struct {
		name    string
		effects []bench.RecordLine
		rules   checkRules
		ok      bool
		unexp   int
		recov   int
		stall   time.Duration
	}{
		{name: "an unexpected dead letter fails the run", effects: all, ok: false, unexp: 1},
		{name: "an allowed dead letter does not", effects: all, rules: checkRules{allow: reasonSet("downstream_error")}, ok: true},
		{name: "unrecovered fails when recovery is required", effects: all,
			rules: checkRules{allow: reasonSet("downstream_error"), requireRecovery: true}, ok: false},
		{name: "recovered passes when recovery is required", effects: recovered,
			rules: checkRules{allow: reasonSet("downstream_error"), requireRecovery: true}, ok: true, recov: 1,
			stall: 39 * time.Second},
		{name: "a recovered letter is still a dead letter", effects: recovered, ok: false, unexp: 1, recov: 1,
			stall: 39 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := judgeRuns(expected, tt.effects, dead, tt.rules)
			rv := res.Runs[0]
			if res.OK != tt.ok || rv.OK != tt.ok || rv.Unexpected != tt.unexp || rv.Recovered != tt.recov ||
				rv.Lost != 0 || rv.DeadLettered["downstream_error"] != 1 {
				t.Fatalf("%+v", rv)
			}
			if tt.stall > 0 && time.Duration(rv.MaxStallMs*1e6) != tt.stall {
				t.Fatalf("stall %v ms, want %s", rv.MaxStallMs, tt.stall)
			}
		})
	}
}

func TestReadRecordAliasesAndErrors(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rec.jsonl")
	_ = os.WriteFile(path, []byte(`{"upstream_msgid":"m1","external_userid":"u1","received_at":"2026-01-01T00:00:00Z"}`+"\n\n"+
		`{"msgid":"m2","user":"u1","at":"2026-01-01T00:00:01Z"}`+"\n"), 0o644)
	recs, err := readRecord(path)
	if err != nil || len(recs) != 2 || recs[0].MsgID != "m1" || recs[0].User != "u1" || recs[0].At.IsZero() {
		t.Fatalf("%+v %v", recs, err)
	}
	_ = os.WriteFile(path, []byte(`{"msgid":"m1","user":"u1","at":"2026-01-01T00:00:00Z"}`+"\n"+`{"msgid":"m2"}`+"\n"), 0o644)
	if _, err := readRecord(path); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("a line without user and at: %v", err)
	}
	for _, args := range [][]string{{"--record", path}, {"--expect", path}, {"--expect", path, "--record", path, "--dlq", "index"}} {
		if _, _, err := check(t, args...); err == nil {
			t.Fatalf("check %v: no error", args)
		}
	}
}

// TestCheckWaits: with --wait, check reads the record again until the
// message still in flight when it started has arrived.
func TestCheckWaits(t *testing.T) {
	dir := t.TempDir()
	exp, _ := writeExpect(t, dir, 1)
	rec := deliver(t, dir, bench.SinkOptions{}, "a-0")
	if _, _, err := check(t, "--expect", exp, "--record", rec, "--dlq", "none"); err == nil {
		t.Fatal("b-0 is missing: check must fail without --wait")
	}
	go func() {
		time.Sleep(time.Second)
		f, _ := os.OpenFile(rec, os.O_APPEND|os.O_WRONLY, 0)
		line, _ := json.Marshal(bench.RecordLine{MsgID: "b-0", User: "b", At: time.Now()})
		_, _ = f.Write(append(line, '\n'))
		_ = f.Close()
	}()
	res, stderr, err := check(t, "--expect", exp, "--record", rec, "--dlq", "none", "--wait", "20s")
	if err != nil || !res.OK || !strings.Contains(stderr, "not handled yet") {
		t.Fatalf("%v %+v\n%s", err, res, stderr)
	}
}
