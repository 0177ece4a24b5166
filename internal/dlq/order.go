package dlq

import (
	"context"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// maxUserLetters bounds how many of one user's letters the scheduler reads
// to keep the user's order (a user with more is ordered among the first
// maxUserLetters by their failure time, the rest as they fall due).
const maxUserLetters = 1000

// dueOfUsers returns, per user, the user's letters that are in due (with
// their due times, which for a claimed letter is the end of its claim,
// and their first failures): one pipelined read of the users' sets and
// one load per 500 letters.
func (x *Index) dueOfUsers(ctx context.Context, users []string) (map[string][]*Entry, error) {
	pipe := x.rdb.Pipeline()
	cmds := make([]*redis.StringSliceCmd, len(users))
	for i, u := range users {
		cmds[i] = pipe.ZRange(ctx, x.key("user", u), 0, maxUserLetters-1)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	var ids []string
	for _, c := range cmds {
		// A user with one letter has no order to keep.
		if len(c.Val()) > 1 {
			ids = append(ids, c.Val()...)
		}
	}
	out := make(map[string][]*Entry, len(users))
	for chunk := range slices.Chunk(ids, 500) {
		es, err := x.load(ctx, chunk)
		if err != nil {
			return nil, err
		}
		for _, e := range es {
			if e != nil && e.State == StateDue && e.NextRetryTime != nil {
				out[e.UserID] = append(out[e.UserID], e)
			}
		}
	}
	return out, nil
}

// firstFailure is a letter's place in its user's order: a user's
// messages are handled one after another, so their first failures come in
// the order the user sent them (a later failure of a retried letter keeps
// its first failure time; its source coordinates are those of the retry).
// Letters that first failed in the same millisecond keep the source order
// the scan sorted them in.
func firstFailure(e *Entry) time.Time {
	if e.FirstFailure != nil {
		return *e.FirstFailure
	}
	return e.FailureTime
}

// inUserOrder keeps each user's recoveries in the order the user sent the
// messages. Letters fall due at different times (a letter that failed
// again backs off longer than one that failed once), so a newer letter
// can be due while an older one of the same user still waits: the newer
// one is held until the older one's due time (or its claim's end), just
// after it. Among the letters of one scan, a user's go in that order too.
// It returns the letters to re-inject now; a failed read of the users'
// letters lets the scan go on in due-time order (logged).
func (s *Scheduler) inUserOrder(ctx context.Context, items []claimed) ([]claimed, []error) {
	var users []string
	seen := map[string]bool{}
	claimedIDs := make(map[string]bool, len(items))
	for _, c := range items {
		claimedIDs[c.id] = true
		if u := c.dl.UserID; u != "" && !seen[u] {
			seen[u] = true
			users = append(users, u)
		}
	}
	if len(users) == 0 {
		return items, nil
	}
	dues, err := s.idx.dueOfUsers(ctx, users)
	if err != nil {
		s.log.Warn("reading users' letters failed; re-injecting in due-time order", zap.Error(err))
		return items, nil
	}
	order := map[string]time.Time{}
	gate := map[string]*Entry{} // user → their oldest letter waiting, not in this scan
	for u, es := range dues {
		for _, e := range es {
			order[e.ID] = firstFailure(e)
			if claimedIDs[e.ID] {
				continue
			}
			if g := gate[u]; g == nil || firstFailure(e).Before(firstFailure(g)) {
				gate[u] = e
			}
		}
	}
	var errs []error
	held := map[string]int{}
	kept := items[:0:0]
	for _, c := range items {
		o, known := order[c.id]
		g := gate[c.dl.UserID]
		if known && g != nil && firstFailure(g).Before(o) {
			held[c.dl.UserID]++
			s.m.heldForOrder.Inc()
			at := g.NextRetryTime.Add(time.Duration(held[c.dl.UserID]) * time.Millisecond)
			if err := s.idx.reschedule(ctx, c.id, at); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		kept = append(kept, c)
	}
	// Each user's letters of this scan, in the user's order, in the
	// places the source order gave that user's letters.
	byUser := map[string][]int{}
	for i, c := range kept {
		byUser[c.dl.UserID] = append(byUser[c.dl.UserID], i)
	}
	for _, pos := range byUser {
		if len(pos) < 2 {
			continue
		}
		cs := make([]claimed, len(pos))
		for j, i := range pos {
			cs[j] = kept[i]
		}
		slices.SortStableFunc(cs, func(a, b claimed) int {
			oa, okA := order[a.id]
			ob, okB := order[b.id]
			if !okA || !okB {
				return 0
			}
			return oa.Compare(ob)
		})
		for j, i := range pos {
			kept[i] = cs[j]
		}
	}
	return kept, errs
}
