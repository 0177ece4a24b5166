package console

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kfpipe/kfpipe/internal/deadletter"
)

// The rate-limit card's story of a user's blocks: when a block began, why
// (the rule and the violations that made the limiter block, or the
// operator's reason) and who (automatic or the operator's name), the
// whitelist and the group, and the history. It joins what is kept
// already: the operator's writes in the audit stream, the limiter's
// refusals in the DLQ index (a refusal that started a block says so in its
// details), and the limiter's own block history (progressive penalty).

// BlockEvent is one block, unblock or list change of a user.
type BlockEvent struct {
	Time time.Time `json:"time"`
	// Kind is "automatic" (the limiter) or "operator".
	Kind string `json:"kind"`
	// Action is block, unblock, whitelist_add, whitelist_remove or
	// set_group.
	Action string `json:"action"`
	Who    string `json:"who"`
	// Why is the operator's reason, or the limiter's rule and violations.
	Why string `json:"why"`
	// Detail is the audit target or the refusal's details.
	Detail string `json:"detail,omitempty"`
	// Letter is the dead letter of the refusal that began an automatic
	// block; AuditID the audit entry of an operator's write.
	Letter  string `json:"letter,omitempty"`
	AuditID string `json:"audit_id,omitempty"`
}

// BlockStory is the answer's block_story in GET /admin/ratelimit/status.
type BlockStory struct {
	// Current is the event that began the block in force (nil: not
	// blocked, or its start is no longer kept: Note says so).
	Current     *BlockEvent  `json:"current,omitempty"`
	Whitelisted bool         `json:"whitelisted"`
	Events      []BlockEvent `json:"events"`
	Note        string       `json:"note,omitempty"`
}

// RateLimitCard is the answer of GET /admin/ratelimit/status/{user}: the
// limiter's status and the story of the user's blocks.
type RateLimitCard struct {
	RateLimitStatus
	BlockStory BlockStory `json:"block_story"`
}

// blockLetters caps how many of the user's refusals the story lists;
// blockLetterReads how many of them (the newest) it reads whole for their
// details, which a list's summaries do not carry.
const (
	blockLetters     = 2000
	blockLetterReads = 20
)

var violationsRE = regexp.MustCompile(`(\d+) consecutive violations`)

func ruleText(r *RateRule) string {
	if r == nil {
		return ""
	}
	return fmt.Sprintf("at most %d in any %g s; %d refusals block for %g h", r.MaxMessages, r.WindowSeconds, r.PenaltyThreshold, r.BlockHours)
}

func (s *limits) blockStory(ctx context.Context, st RateLimitStatus) (BlockStory, error) {
	bs := BlockStory{Whitelisted: st.Group == "whitelist", Events: []BlockEvent{}}
	var notes []string
	// The limiter's refusals that began a block.
	f := DLQFilter{User: st.User, Reason: string(deadletter.RateLimited), Limit: 500}
	seen, fetched := 0, 0
	auto := map[int64]bool{}
	for seen < blockLetters {
		ls, next, err := s.dlq.List(ctx, f)
		if err != nil {
			return bs, err
		}
		for _, l := range ls {
			seen++
			if l.Details == "" && fetched < blockLetterReads {
				// A list holds summaries; the details are in the whole
				// letter (read from the DLQ topic).
				fetched++
				if whole, err := s.dlq.Get(ctx, l.ID); err == nil {
					l.Details = whole.Details
				}
			}
			if !strings.Contains(l.Details, "blocked") {
				continue
			}
			at := l.FailureTime
			if l.FirstFailure != nil {
				at = *l.FirstFailure
			}
			why := "the limiter's rule"
			if m := violationsRE.FindStringSubmatch(l.Details); m != nil {
				why = m[1] + " consecutive violations"
			} else if st.Rule != nil {
				why = strconv.Itoa(st.Rule.PenaltyThreshold) + " consecutive violations"
			}
			if rt := ruleText(st.Rule); rt != "" {
				why += " of group " + groupOf(l.Details, st.Group) + "'s rule (" + rt + ")"
			}
			bs.Events = append(bs.Events, BlockEvent{Time: at, Kind: "automatic", Action: "block", Who: "rate limiter",
				Why: why, Detail: l.Details, Letter: l.ID})
			auto[at.Unix()] = true
		}
		if next == "" {
			break
		}
		f.Cursor = next
	}
	if seen >= blockLetters {
		notes = append(notes, fmt.Sprintf("only the newest %d refusals were listed", blockLetters))
	}
	if fetched == blockLetterReads && seen > fetched {
		notes = append(notes, fmt.Sprintf("the details of the newest %d refusals only were read", blockLetterReads))
	}
	// The progressive penalty's own history (blocks whose refusal letter
	// is gone).
	for _, h := range st.BlockHistory {
		if auto[h.Unix()] || auto[h.Unix()-1] || auto[h.Unix()+1] {
			continue
		}
		bs.Events = append(bs.Events, BlockEvent{Time: h, Kind: "automatic", Action: "block", Who: "rate limiter",
			Why: "the limiter's rule (" + ruleText(st.Rule) + ")"})
	}
	// The operator's writes.
	if err := s.operatorBlocks(ctx, st.User, &bs, &notes); err != nil {
		return bs, err
	}
	slices.SortStableFunc(bs.Events, func(a, b BlockEvent) int { return b.Time.Compare(a.Time) })
	if st.Blocked {
		for i, e := range bs.Events {
			if e.Action == "unblock" || e.Action == "whitelist_add" {
				break // the block in force began after this
			}
			if e.Action == "block" {
				bs.Current = &bs.Events[i]
				break
			}
		}
		if bs.Current == nil {
			notes = append(notes, "how the block in force began is no longer kept (its refusal letter and audit entry are gone)")
		}
	}
	bs.Note = strings.Join(notes, "; ")
	return bs, nil
}

func groupOf(details, fallback string) string {
	if g, ok := strings.CutPrefix(details, "group "); ok {
		if i := strings.IndexByte(g, ':'); i > 0 {
			return g[:i]
		}
	}
	return fallback
}

// operatorBlocks adds the operator's rate-limit writes on user from the
// audit stream (newest auditScan entries).
func (s *limits) operatorBlocks(ctx context.Context, user string, bs *BlockStory, notes *[]string) error {
	target := "user:" + user
	next, err := s.scanAudit(ctx, "+", auditScan, 500, func(e AuditEntry) bool {
		action, ok := strings.CutPrefix(e.Action, "ratelimit.")
		if ok && e.Result == "ok" && (e.Target == target || strings.HasPrefix(e.Target, target+" ")) && action != "set_rules" {
			at, _ := time.Parse(time.RFC3339Nano, e.Time)
			bs.Events = append(bs.Events, BlockEvent{Time: at, Kind: "operator", Action: action, Who: e.Who,
				Why: e.Reason, Detail: e.Target, AuditID: e.ID})
		}
		return true
	})
	if err == nil && next != "" {
		*notes = append(*notes, fmt.Sprintf("only the newest %d audit entries were searched", auditScan))
	}
	return err
}
