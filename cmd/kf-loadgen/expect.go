package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/kfpipe/kfpipe/internal/bench"
)

// expectLine is one message of the expected set (--expect FILE): one JSON
// object per line, in the order sent, so each user's msgids appear in the
// user's order (index counts from 0 per user and run).
type expectLine struct {
	Run   string    `json:"run"`
	MsgID string    `json:"msgid"`
	User  string    `json:"user"`
	Index int       `json:"index"`
	At    time.Time `json:"at"` // when it was sent
}

// expectWriter appends expectLines to a file.
type expectWriter struct {
	f   *os.File
	w   *bufio.Writer
	err error
}

func createExpect(path string) (*expectWriter, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--expect: %w", err)
	}
	return &expectWriter{f: f, w: bufio.NewWriter(f)}, nil
}

func (e *expectWriter) add(l expectLine) {
	if e == nil || e.err != nil {
		return
	}
	b, _ := json.Marshal(l)
	_, e.err = e.w.Write(append(b, '\n'))
}

func (e *expectWriter) close() error {
	if e == nil {
		return nil
	}
	if err := e.w.Flush(); e.err == nil {
		e.err = err
	}
	if err := e.f.Close(); e.err == nil {
		e.err = err
	}
	if e.err != nil {
		return fmt.Errorf("--expect: %w", e.err)
	}
	return nil
}

// readLines decodes one JSON object per line of r into fn; it names the
// file and line of a bad one.
func readLines(name string, r io.Reader, fn func(line []byte) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	n := 0
	for sc.Scan() {
		n++
		if len(sc.Bytes()) == 0 {
			continue
		}
		if err := fn(sc.Bytes()); err != nil {
			return fmt.Errorf("%s line %d: %w", name, n, err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

func readExpect(path string) ([]expectLine, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--expect: %w", err)
	}
	defer f.Close()
	var out []expectLine
	err = readLines(path, f, func(b []byte) error {
		var l expectLine
		if err := json.Unmarshal(b, &l); err != nil {
			return err
		}
		if l.MsgID == "" || l.User == "" {
			return fmt.Errorf("msgid and user are required")
		}
		out = append(out, l)
		return nil
	})
	if err == nil && len(out) == 0 {
		err = fmt.Errorf("--expect %s: no messages", path)
	}
	return out, err
}

// readRecord reads a receiver's record: bench.RecordLine per line, in
// arrival order; upstream_msgid and external_userid stand for msgid and
// user, received_at for at.
func readRecord(path string) ([]bench.RecordLine, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--record: %w", err)
	}
	defer f.Close()
	var out []bench.RecordLine
	err = readLines(path, f, func(b []byte) error {
		var l struct {
			bench.RecordLine
			UpstreamMsgID  string    `json:"upstream_msgid"`
			ExternalUserID string    `json:"external_userid"`
			ReceivedAt     time.Time `json:"received_at"`
		}
		if err := json.Unmarshal(b, &l); err != nil {
			return err
		}
		r := l.RecordLine
		if r.MsgID == "" {
			r.MsgID = l.UpstreamMsgID
		}
		if r.User == "" {
			r.User = l.ExternalUserID
		}
		if r.At.IsZero() {
			r.At = l.ReceivedAt
		}
		if r.MsgID == "" || r.User == "" || r.At.IsZero() {
			return fmt.Errorf("msgid, user and at are required")
		}
		out = append(out, r)
		return nil
	})
	return out, err
}
