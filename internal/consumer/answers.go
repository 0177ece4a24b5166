package consumer

import (
	"sync"
	"time"
)

// answers keeps the 2xx answer of an http receiver whose replies could not
// be sent yet (a reply's claim or send failed: the state store or WeChat
// was unreachable), by the message's dedup key. The receiver did its work
// when it answered 2xx: the message's next attempt in this process sends
// the kept answer's replies again instead of calling the receiver a second
// time (issue 48: a Redis partition during the reply turned one effect
// into two). The replies themselves are effects with their own records, so
// sending the kept answer again sends each of them at most once.
//
// An answer is kept for answerKeep, at most maxAnswers of them and
// maxAnswerBytes in all; past any, the next attempt calls the receiver
// again (its Idempotency-Key is the same), which is what a new owner of the
// partition does anyway.
type answers struct {
	mu    sync.Mutex
	byID  map[string]keptAnswer
	bytes int
	now   func() time.Time
}

type keptAnswer struct {
	body []byte
	at   time.Time
}

const (
	answerKeep     = 15 * time.Minute
	maxAnswers     = 4096
	maxAnswerBytes = 32 << 20
)

func newAnswers(now func() time.Time) *answers {
	return &answers{byID: map[string]keptAnswer{}, now: now}
}

// keep records body as key's answer; false when the memo is full.
func (a *answers) keep(key string, body []byte) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	if old, ok := a.byID[key]; ok {
		delete(a.byID, key)
		a.bytes -= len(old.body)
	}
	if len(a.byID) >= maxAnswers || a.bytes+len(body) > maxAnswerBytes {
		for k, v := range a.byID {
			if now.Sub(v.at) > answerKeep {
				delete(a.byID, k)
				a.bytes -= len(v.body)
			}
		}
		if len(a.byID) >= maxAnswers || a.bytes+len(body) > maxAnswerBytes {
			return false
		}
	}
	a.byID[key] = keptAnswer{body: body, at: now}
	a.bytes += len(body)
	return true
}

// take returns key's kept answer and forgets it.
func (a *answers) take(key string) ([]byte, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	v, ok := a.byID[key]
	if !ok {
		return nil, false
	}
	delete(a.byID, key)
	a.bytes -= len(v.body)
	if a.now().Sub(v.at) > answerKeep {
		return nil, false
	}
	return v.body, true
}
