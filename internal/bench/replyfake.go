package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
)

// The replies scenario's fake WeChat runs in a child process (the harness
// with -scenario replies-fake), so that the consumer process's CPU a reply
// is ours — the claim, the HTTP client, the record — and the fake's
// serving of send_msg is reported apart (issue 45).

// fakeEvent is one line the child writes on its stdout.
type fakeEvent struct {
	URL        string `json:"url,omitempty"`
	CorpID     string `json:"corp_id,omitempty"`
	Secret     string `json:"secret,omitempty"`
	Replies    int    `json:"replies"`
	Duplicates int    `json:"duplicates"`
	CPUus      int64  `json:"cpu_us"`
}

// ReplyFake is the child: a fake WeChat for account whose users 0..users-1
// each wrote first (their sessions are open). It writes its address and
// credentials, then answers each "stats" line on in with its replies, its
// repeated msgids and its own CPU so far, until in ends.
func ReplyFake(account string, users int, in io.Reader, out io.Writer) error {
	fake := wecomtest.NewHandler(wecomtest.Options{Accounts: []string{account}, ReplyQuota: 1 << 30})
	for u := range users {
		fake.AddText(account, UserName(u), "hi")
	}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	enc := json.NewEncoder(out)
	if err := enc.Encode(fakeEvent{URL: srv.URL, CorpID: fake.CorpID(), Secret: fake.Secret()}); err != nil {
		return err
	}
	lines := bufio.NewScanner(in)
	for lines.Scan() {
		if lines.Text() != "stats" {
			continue
		}
		ev := fakeEvent{Replies: len(fake.Replies("", "")), Duplicates: fake.DuplicateMsgIDs(), CPUus: CPUTime().Microseconds()}
		if err := enc.Encode(ev); err != nil {
			return err
		}
	}
	return lines.Err()
}

// replyFake is the parent's handle on a child running ReplyFake.
type replyFake struct {
	fakeEvent
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines *bufio.Scanner
}

// startReplyFake starts the child (this executable) for account and users.
func startReplyFake(ctx context.Context, account string, users int) (*replyFake, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, self, "-scenario", "replies-fake", "-fake-account", account, "-users", strconv.Itoa(users))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the fake WeChat: %w", err)
	}
	f := &replyFake{cmd: cmd, in: in, lines: bufio.NewScanner(out)}
	ev, err := f.next()
	if err != nil {
		f.close()
		return nil, err
	}
	f.fakeEvent = ev
	return f, nil
}

func (f *replyFake) next() (fakeEvent, error) {
	if !f.lines.Scan() {
		return fakeEvent{}, fmt.Errorf("the fake WeChat ended: %v", f.lines.Err())
	}
	var ev fakeEvent
	if err := json.Unmarshal(f.lines.Bytes(), &ev); err != nil {
		return fakeEvent{}, fmt.Errorf("the fake WeChat wrote %q: %w", f.lines.Text(), err)
	}
	return ev, nil
}

// stats asks the child for its replies so far and its CPU.
func (f *replyFake) stats() (fakeEvent, error) {
	if _, err := io.WriteString(f.in, "stats\n"); err != nil {
		return fakeEvent{}, err
	}
	return f.next()
}

func (f *replyFake) close() {
	_ = f.in.Close()
	done := make(chan struct{})
	go func() { _ = f.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = f.cmd.Process.Kill()
		<-done
	}
}
