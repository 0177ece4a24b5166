package consumer

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/kfpipe/kfpipe/internal/chatmsg"
	"github.com/kfpipe/kfpipe/internal/testenv"
)

func testEnvelope(user string, seq int64) *envelope {
	return &envelope{
		km:  &kafka.Message{TopicPartition: kafka.TopicPartition{Offset: kafka.Offset(seq)}},
		msg: &chatmsg.ChatMessage{ExternalUserID: user, MessageID: seq},
	}
}

// TestActorSendDieRace sends to users whose actors keep dying (idle timeout
// of a few microseconds) and checks that no message is lost or reordered
// and that at most one actor per user handles messages at a time (a send
// racing the actor's decision to die). Run it with -race.
func TestActorSendDieRace(t *testing.T) {
	const users, perUser = 20, 400
	var mu sync.Mutex
	got := map[string][]int64{}
	busy := map[string]*atomic.Int32{}
	for u := 0; u < users; u++ {
		busy[fmt.Sprint("u", u)] = &atomic.Int32{}
	}
	var overlaps, created atomic.Int64
	r := newRegistry(perUser, 20*time.Microsecond, nil, func(env *envelope) {
		u := env.msg.ExternalUserID
		if busy[u].Add(1) != 1 {
			overlaps.Add(1)
		}
		if env.msg.MessageID%7 == 0 {
			runtime.Gosched()
		}
		mu.Lock()
		got[u] = append(got[u], env.msg.MessageID)
		mu.Unlock()
		busy[u].Add(-1)
	}, func(d int) {
		if d > 0 {
			created.Add(1)
		}
	})
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < perUser; i++ {
		for u := 0; u < users; u++ {
			if !r.send(fmt.Sprint("u", u), testEnvelope(fmt.Sprint("u", u), int64(i))) {
				t.Fatalf("send refused")
			}
		}
		if rng.IntN(4) == 0 {
			time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond) // let actors die
		}
	}
	testenv.Eventually(t, 5*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, s := range got {
			n += len(s)
		}
		return testenv.Check(n == users*perUser, "%d messages handled, want %d", n, users*perUser)
	})
	testenv.Eventually(t, 5*time.Second, func() error {
		n := r.len()
		return testenv.Check(n == 0, "%d actors still registered, want 0", n)
	})
	r.close()
	if created.Load() <= users {
		t.Fatalf("only %d actors created for %d users: the race was not exercised", created.Load(), users)
	}
	t.Logf("%d actors created for %d users", created.Load(), users)
	if n := overlaps.Load(); n != 0 {
		t.Fatalf("%d times two actors of one user ran at once", n)
	}
	for u, s := range got {
		for i, id := range s {
			if id != int64(i) {
				t.Fatalf("user %s: message %d at position %d (lost or reordered): %v", u, id, i, s[:i+1])
			}
		}
	}
}

// TestActorMailboxBound checks that a user's mailbox refuses beyond
// mailbox_size while its handler is busy, and other users are unaffected.
func TestActorMailboxBound(t *testing.T) {
	release := make(chan struct{})
	var handled atomic.Int64
	r := newRegistry(3, time.Hour, nil, func(env *envelope) {
		if env.msg.ExternalUserID == "slow" {
			<-release
		}
		handled.Add(1)
	}, nil)
	defer r.close()
	accepted := 0
	for i := 0; i < 10; i++ {
		if r.send("slow", testEnvelope("slow", int64(i))) {
			accepted++
		}
		if i == 0 {
			time.Sleep(20 * time.Millisecond) // first message taken by the goroutine
		}
	}
	// One being handled plus three in the mailbox.
	if accepted != 4 {
		t.Fatalf("accepted %d, want 4 (1 in progress + mailbox of 3)", accepted)
	}
	for i := 0; i < 100; i++ {
		if !r.send("fast", testEnvelope("fast", int64(i))) {
			// The fast user is never blocked by the slow one, but its own
			// mailbox is small; wait for room.
			time.Sleep(time.Millisecond)
			i--
		}
	}
	waitCount(t, 2*time.Second, "handled", &handled, 100)
	close(release)
	waitCount(t, 2*time.Second, "handled", &handled, 104)
}

// TestActorIdleLifetime checks Active -> Dead after the idle timeout and
// that a later message gets a fresh actor.
func TestActorIdleLifetime(t *testing.T) {
	var handled atomic.Int64
	r := newRegistry(4, 30*time.Millisecond, nil, func(*envelope) { handled.Add(1) }, nil)
	defer r.close()
	r.send("u", testEnvelope("u", 1))
	v, _ := r.actors.Load("u")
	first := v.(*actor)
	time.Sleep(10 * time.Millisecond)
	if first.state.Load() != stateActive || r.len() != 1 {
		t.Fatalf("actor not active right after a message")
	}
	testenv.Eventually(t, 2*time.Second, func() error {
		s := first.state.Load()
		return testenv.Check(s == stateDead, "actor state %d, want dead (%d)", s, stateDead)
	})
	if _, ok := r.actors.Load("u"); ok || r.len() != 0 {
		t.Fatalf("dead actor still registered")
	}
	r.send("u", testEnvelope("u", 2))
	waitCount(t, time.Second, "handled", &handled, 2)
	v, _ = r.actors.Load("u")
	if v.(*actor) == first {
		t.Fatalf("message went to the dead actor")
	}
}

// TestActorMemory measures the heap held per idle known user with 100k
// users (goal: <= 4 KiB) and checks idle actors hold no goroutine.
func TestActorMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	const users = 100_000
	var handled atomic.Int64
	r := newRegistry(256, time.Hour, nil, func(*envelope) { handled.Add(1) }, nil)
	names := make([]string, users)
	for i := range names {
		names[i] = fmt.Sprintf("wmXXXXXXXXXXXXXXXXXXXXXX%08d", i) // external_userid-like length
	}
	envs := make([]*envelope, users)
	for i := range envs {
		envs[i] = testEnvelope(names[i], 1)
	}
	goBefore := runtime.NumGoroutine()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := 0; i < users; i++ {
		r.send(names[i], envs[i])
	}
	waitCount(t, 30*time.Second, "handled", &handled, users)
	testenv.Eventually(t, 5*time.Second, func() error {
		n := runtime.NumGoroutine()
		return testenv.Check(n <= goBefore+2, "%d goroutines, want at most %d", n, goBefore+2)
	})
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(envs) // measured before and after: only the actors differ
	per := float64(after.HeapAlloc-before.HeapAlloc) / users
	t.Logf("idle actors: %d users, %.0f bytes heap per user (goroutines %d -> %d)", users, per, goBefore, runtime.NumGoroutine())
	if per > 4096 {
		t.Fatalf("%.0f bytes per idle user, goal <= 4096", per)
	}
	if r.len() != users {
		t.Fatalf("registry holds %d actors, want %d", r.len(), users)
	}
	r.close()
	runtime.KeepAlive(names)
}
