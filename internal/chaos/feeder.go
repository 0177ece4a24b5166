package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/kfpipe/kfpipe/internal/wecom"
	"github.com/kfpipe/kfpipe/internal/wecom/wecomtest"
)

// Sent is one message the Feeder put into the fake WeChat's log.
type Sent struct {
	MsgID    string
	OpenKfID string
	User     string
	Index    int // position in the user's WeChat order
	At       time.Time
}

// Feeder writes known messages into the fake WeChat and tells kf-producer
// about them with signed callbacks, as WeChat does. Users are spread over
// the pipeline's accounts (a user belongs to one account).
type Feeder struct {
	p     *Pipeline
	users []string
	// maxPerUser, when set, caps the messages of one user (Load.MaxPerUser).
	maxPerUser int

	mu        sync.Mutex
	sent      []Sent
	perUser   map[string]int
	callbacks int
	cbFailed  int
}

// NewFeeder prepares users distinct users ("u0000"…).
func NewFeeder(p *Pipeline, users int) *Feeder {
	f := &Feeder{p: p, perUser: map[string]int{}}
	for i := range users {
		f.users = append(f.users, p.UserName(i))
	}
	return f
}

// UserName is the external_userid of the Feeder's user i in this pipeline.
func (p *Pipeline) UserName(i int) string {
	return fmt.Sprintf("u%04d-%s", i, p.Prefix[len("chaos-"):len(p.Prefix)-1])
}

// BotName is the external_userid of the bot a Load with BotPerMin adds.
func (p *Pipeline) BotName() string { return "bot-" + p.Prefix[len("chaos-"):len(p.Prefix)-1] }

func (f *Feeder) account(userIdx int) string {
	return f.p.OpenKfIDs[userIdx%len(f.p.OpenKfIDs)]
}

// appendUsers appends one message for each entry of users (a user may
// repeat) to the fake WeChat, users[i] on account kfOf(i, users[i]), in
// that order, and sends one callback per account touched.
func (f *Feeder) appendUsers(ctx context.Context, users []string, kfOf func(i int, user string) string) {
	type item struct {
		User   string `json:"external_userid"`
		Origin int    `json:"origin"`
		Type   string `json:"msgtype"`
	}
	byKf := map[string][]json.RawMessage{}
	usersOf := map[string][]string{}
	var order []string
	for i, u := range users {
		kf := kfOf(i, u)
		if _, ok := byKf[kf]; !ok {
			order = append(order, kf)
		}
		raw, err := json.Marshal(item{User: u, Origin: wecom.OriginCustomer, Type: "text"})
		if err != nil {
			panic(err)
		}
		byKf[kf] = append(byKf[kf], raw)
		usersOf[kf] = append(usersOf[kf], u)
	}
	now := time.Now()
	for _, kf := range order {
		// The log's order is the WeChat order; Append under the feeder's
		// lock keeps our record in the same order.
		f.mu.Lock()
		ids := f.p.Fake.Append(kf, byKf[kf]...)
		for i, id := range ids {
			u := usersOf[kf][i]
			f.sent = append(f.sent, Sent{MsgID: id, OpenKfID: kf, User: u, Index: f.perUser[u], At: now})
			f.perUser[u]++
		}
		f.mu.Unlock()
	}
	for _, kf := range order {
		f.notify(ctx, kf)
	}
}

// Feed appends total messages from random users at about rate messages a
// second, in bursts every 100 ms, and sends a callback for each account a
// burst touched. It returns when all are appended or ctx ends.
func (f *Feeder) Feed(ctx context.Context, total int, rate float64) error {
	if f.maxPerUser > 0 && total > f.maxPerUser*len(f.users) {
		return fmt.Errorf("feed: %d messages from %d users at most %d each cannot be", total, len(f.users), f.maxPerUser)
	}
	const tick = 100 * time.Millisecond
	perTick := max(1, int(rate*tick.Seconds()))
	t := time.NewTicker(tick)
	defer t.Stop()
	for done := 0; done < total; {
		n := min(perTick, total-done)
		idx := make([]int, n)
		users := make([]string, n)
		f.mu.Lock()
		taken := map[string]int{}
		for i := range n {
			for {
				idx[i] = rand.IntN(len(f.users))
				users[i] = f.users[idx[i]]
				if f.maxPerUser == 0 || f.perUser[users[i]]+taken[users[i]] < f.maxPerUser {
					break
				}
			}
			taken[users[i]]++
		}
		f.mu.Unlock()
		f.appendUsers(ctx, users, func(i int, _ string) string { return f.account(idx[i]) })
		done += n
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// Bot appends messages of user at perMin a minute, on the first account,
// until ctx ends.
func (f *Feeder) Bot(ctx context.Context, user string, perMin float64) {
	const tick = 100 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	acc := 0.0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		acc += perMin / 60 * tick.Seconds()
		var users []string
		for ; acc >= 1; acc-- {
			users = append(users, user)
		}
		if len(users) > 0 {
			f.appendUsers(ctx, users, func(int, string) string { return f.p.OpenKfIDs[0] })
		}
	}
}

// notify sends one callback, retrying briefly like WeChat does; when
// kf-producer stays unreachable the safety sync picks the messages up.
func (f *Feeder) notify(ctx context.Context, kf string) {
	for attempt := 0; attempt < 3; attempt++ {
		tok := f.p.Fake.IssueToken(kf)
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := f.sender().SendEvent(cctx, kf, tok)
		cancel()
		if err == nil {
			ok := resp.StatusCode == http.StatusOK
			_ = resp.Body.Close()
			if ok {
				f.mu.Lock()
				f.callbacks++
				f.mu.Unlock()
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	f.mu.Lock()
	f.cbFailed++
	f.mu.Unlock()
}

func (f *Feeder) sender() *wecomtest.CallbackSender { return f.p.sender }

// Sent returns every message fed so far, in feeding order.
func (f *Feeder) Sent() []Sent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Sent(nil), f.sent...)
}

// Callbacks returns the callbacks answered 200 and those given up.
func (f *Feeder) Callbacks() (ok, failed int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.callbacks, f.cbFailed
}
