package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
)

// Ledger records what a load generator sent and what reached the end of
// the pipeline (the consumer's effects, and the dead letters), and checks
// the pipeline's properties: no loss, no duplicate effect, per-user order.
// Messages are identified by their upstream msgid; seq is the message's
// position in its user's stream.
type Ledger struct {
	mu       sync.Mutex
	sent     map[string]sentMsg // msgid → what was sent
	effects  map[string]int     // msgid → times handled
	dead     map[string]string  // msgid → DLQ reason
	order    map[string][]int   // user → seqs in the order handled
	unknown  int
	lat      Latencies
	lastSeen time.Time
}

type sentMsg struct {
	user string
	seq  int
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger {
	return &Ledger{sent: map[string]sentMsg{}, effects: map[string]int{}, dead: map[string]string{},
		order: map[string][]int{}}
}

// Sent records that msgid was sent as user's seq-th message.
func (l *Ledger) Sent(msgid, user string, seq int) {
	l.mu.Lock()
	l.sent[msgid] = sentMsg{user: user, seq: seq}
	l.mu.Unlock()
}

// Handled records one effect of m.
func (l *Ledger) Handled(m *chatmsg.ChatMessage, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lastSeen = now
	s, ok := l.sent[m.UpstreamMsgID]
	if !ok {
		l.unknown++
		return
	}
	l.effects[m.UpstreamMsgID]++
	l.order[s.user] = append(l.order[s.user], s.seq)
	if m.ProducedAt > 0 {
		l.lat.Add(float64(now.UnixMicro()-m.ProducedAt*1000) / 1000)
	}
}

// DeadLettered records that msgid went to the DLQ with reason.
func (l *Ledger) DeadLettered(msgid, reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.sent[msgid]; ok {
		l.dead[msgid] = reason
	}
}

// Accounted is how many sent messages were handled or dead-lettered.
func (l *Ledger) Accounted() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for id := range l.sent {
		if l.effects[id] > 0 || l.dead[id] != "" {
			n++
		}
	}
	return n
}

// Report is the verdict of a Ledger.
type Report struct {
	Sent         int            `json:"sent"`
	Handled      int            `json:"handled"`
	DeadLettered map[string]int `json:"dead_lettered"`
	Lost         int            `json:"lost"`
	Duplicates   int            `json:"duplicate_effects"`
	OutOfOrder   int            `json:"out_of_order_users"`
	Unknown      int            `json:"unknown_messages"`
	P50Ms        float64        `json:"p50_ms"`
	P99Ms        float64        `json:"p99_ms"`
	Examples     []string       `json:"examples,omitempty"`
}

// OK reports whether nothing was lost, duplicated or reordered.
func (r Report) OK() bool { return r.Lost == 0 && r.Duplicates == 0 && r.OutOfOrder == 0 }

// Verify checks the ledger. A message counts as lost when it was neither
// handled nor dead-lettered. Per-user order is checked over the handled
// messages only: a dead-lettered message leaves its user's order with a
// recorded reason (I4), so the handled sequence must be increasing.
func (l *Ledger) Verify() Report {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := Report{Sent: len(l.sent), DeadLettered: map[string]int{}, Unknown: l.unknown}
	var ex []string
	for id := range l.sent {
		n := l.effects[id]
		switch {
		case n > 0:
			r.Handled++
			if n > 1 {
				r.Duplicates++
				ex = append(ex, fmt.Sprintf("duplicate: %s handled %d times", id, n))
			}
			if reason := l.dead[id]; reason != "" {
				// Both handled and dead-lettered: a second, unexpected fate.
				r.Duplicates++
				ex = append(ex, fmt.Sprintf("duplicate: %s handled and dead-lettered (%s)", id, reason))
			}
		case l.dead[id] != "":
			r.DeadLettered[l.dead[id]]++
		default:
			r.Lost++
			ex = append(ex, "lost: "+id)
		}
	}
	for user, seqs := range l.order {
		for i := 1; i < len(seqs); i++ {
			if seqs[i] <= seqs[i-1] {
				r.OutOfOrder++
				ex = append(ex, fmt.Sprintf("order: user %s handled seq %d after %d", user, seqs[i], seqs[i-1]))
				break
			}
		}
	}
	sort.Strings(ex)
	if len(ex) > 10 {
		ex = ex[:10]
	}
	r.Examples = ex
	r.P50Ms, r.P99Ms = round(l.lat.Quantile(0.5), 2), round(l.lat.Quantile(0.99), 2)
	return r
}

// SinkHandler is the HTTP endpoint the consumer's http handler posts to
// (handler.type=http, handler.http.url): each POST body is one ChatMessage.
func (l *Ledger) SinkHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		m, err := chatmsg.Decode(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		l.Handled(m, time.Now())
		w.WriteHeader(http.StatusNoContent)
	})
}

// deadLetter is the part of a DLQ record the ledger needs.
type deadLetter struct {
	Reason        string               `json:"failure_reason"`
	UpstreamMsgID string               `json:"upstream_msgid"`
	Original      *chatmsg.ChatMessage `json:"original_message"`
}

// AddDeadLetter records a DLQ record's value.
func (l *Ledger) AddDeadLetter(value []byte) error {
	var dl deadLetter
	if err := json.Unmarshal(value, &dl); err != nil {
		return fmt.Errorf("dead letter: %w", err)
	}
	id := dl.UpstreamMsgID
	if id == "" && dl.Original != nil {
		id = dl.Original.UpstreamMsgID
	}
	if id == "" {
		return fmt.Errorf("dead letter without upstream msgid (reason %s)", dl.Reason)
	}
	l.DeadLettered(id, strings.TrimSpace(dl.Reason))
	return nil
}
