package console

// A customer's timeline: "customer X says the bot never answered". It is
// assembled on request from what the pipeline already keeps, and writes
// nothing: the user's records on the main topic (their partition is the
// one the producer's key hashing picks), the DLQ index, the dedup and
// reply marks of the schedule-consumers, the rate limiter's state and the
// audit stream. Where none of them still holds an answer it says so.

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kfpipe/kfpipe/internal/deadletter"
)

// CustomerSource is what the timeline reads beyond the DLQ index, the
// limiter and the audit stream. The daemon's Pipeline implements it; with
// a Pipeline that does not, the timeline answers from those three alone
// and says the main topic was not read.
type CustomerSource interface {
	// UserRecords reads the main-topic records keyed by user from since
	// on, at most max of the partition's newest records scanned.
	UserRecords(ctx context.Context, user string, since time.Time, max int) (TopicScan, error)
	// Effects reports, for each message, what the schedule-consumers
	// recorded of it: done or not, and its replies.
	Effects(ctx context.Context, user string, msgs []MessageRef) ([]MessageEffects, error)
}

// TopicScan is what UserRecords read of the user's partition.
type TopicScan struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// From and To are the offsets scanned (To exclusive); Low is the
	// partition's oldest offset still kept (older records expired).
	From int64 `json:"from_offset"`
	To   int64 `json:"to_offset"`
	Low  int64 `json:"low_offset"`
	// Truncated: the window held more records than max; older ones were
	// not read.
	Truncated bool `json:"truncated"`
	// Incomplete says why the read stopped before To ("" when it did not).
	Incomplete string `json:"incomplete,omitempty"`
	// FromTime is the time of the first record read (anyone's): where
	// the read really began when it was Truncated or Expired.
	FromTime time.Time `json:"from_time,omitzero"`
	// Expired: the read began at the oldest record kept, and older
	// records of the window may have expired (retention).
	Expired bool          `json:"expired,omitempty"`
	Records []TopicRecord `json:"-"`
}

// TopicRecord is one of the user's records on the main topic.
type TopicRecord struct {
	MainRecord
	// Archived: read from the conversation archive, not the main topic.
	Archived bool `json:"archived,omitempty"`
}

// MessageRef names a message for Effects.
type MessageRef struct {
	OpenKfID      string
	UpstreamMsgID string
	SendTime      int64
}

// MessageEffects is what the schedule-consumers recorded of a message.
// Done is "done" (processed, effect recorded), "not_done" (no mark while
// marks are still kept) or "unknown" (older than the marks are kept).
type MessageEffects struct {
	Done    string      `json:"done"`
	Replies []ReplyMark `json:"replies"`
	// RepliesUnknown: the reply marks of a message this old may have
	// expired.
	RepliesUnknown bool `json:"replies_unknown,omitempty"`
	// ReplySkipped is the routine refusal the handler finished the
	// message with ("" none): servicer_session (a human servicer held the
	// session, 95018), reply_window, session_ended, welcome_code_expired.
	ReplySkipped string `json:"reply_skipped,omitempty"`
}

// ReplyMark is one reply recorded sent, under its exactly-once key.
type ReplyMark struct {
	Key string `json:"key"`
	// MsgID is the msgid the reply was sent to WeChat with.
	MsgID string `json:"msgid,omitempty"`
}

// Done values of MessageEffects.
const (
	DoneYes     = "done"
	DoneNo      = "not_done"
	DoneUnknown = "unknown"
)

// Outcomes of a TimelineMessage, from the customer's point of view.
const (
	OutcomeAnswered   = "answered"    // processed, a reply recorded sent
	OutcomeProcessed  = "processed"   // processed, no reply recorded
	OutcomeInDLQ      = "dead_letter" // failed, its letter waits for a retry or review
	OutcomeInProgress = "in_progress" // on the main topic (or re-injected), not processed yet
	// OutcomeReplySkipped: processed, its reply refused by WeChat for a
	// routine reason (a human servicer held the session, the reply
	// window): finished, not dead-lettered.
	OutcomeReplySkipped = "reply_skipped"
	OutcomeUnknownMsg   = "unknown" // what became of it is no longer kept
)

// Timeline is the answer of GET /admin/customers/{user}/timeline.
type Timeline struct {
	User  string `json:"user"`
	MsgID string `json:"msgid,omitempty"`
	// Known: something about the user was found anywhere. A user with
	// nothing anywhere (or a mistyped id) has Known false and a Summary
	// that says so.
	Known   bool      `json:"known"`
	Summary string    `json:"summary"`
	Time    time.Time `json:"time"`
	// Since is the start of the window the main topic was read in.
	Since time.Time `json:"since"`
	// Topic is what was read of the main topic (nil: not read).
	Topic *TopicScan `json:"topic,omitempty"`
	// Archive is what was read of the conversation archive (nil: not
	// configured, or not read).
	Archive *ArchiveRead `json:"archive,omitempty"`
	// Read says the range of time the messages were actually read for;
	// Complete that it is the whole window, so a message not shown was
	// not received in it.
	Read     string            `json:"read"`
	Complete bool              `json:"complete"`
	Limiter  *RateLimitStatus  `json:"limiter,omitempty"`
	Messages []TimelineMessage `json:"messages"`
	Events   []TimelineEvent   `json:"events"`
	Sources  map[string]string `json:"sources"`
	Notes    []string          `json:"notes"`
}

// TimelineMessage is one of the user's messages and where it went.
type TimelineMessage struct {
	UpstreamMsgID string     `json:"upstream_msgid"`
	OpenKfID      string     `json:"open_kfid,omitempty"`
	MsgType       string     `json:"msg_type,omitempty"`
	SendTime      *time.Time `json:"send_time,omitempty"`
	Preview       string     `json:"preview,omitempty"`
	// Received are the message's records on the main topic, first receipt
	// then the DLQ's re-injections.
	Received []TopicRecord `json:"received"`
	// Limiter is "admitted", "refused" (a rate_limited or user_blocked
	// letter) or "unknown".
	Limiter string `json:"limiter"`
	// Processed is done, not_done or unknown (MessageEffects.Done).
	Processed string `json:"processed"`
	// Attempts counts the message's deliveries to the schedule-consumers
	// seen (its records on the main topic, or the letters' retries).
	Attempts int          `json:"attempts"`
	Replies  []ReplyMark  `json:"replies"`
	Letters  []DLQMessage `json:"letters"`
	// ReplySkipped is the routine refusal the message was finished with
	// (MessageEffects.ReplySkipped).
	ReplySkipped string         `json:"reply_skipped,omitempty"`
	Outcome      string         `json:"outcome"`
	Story        string         `json:"story"`
	effects      MessageEffects // as read
	at           time.Time      // for ordering: newest first
	off          int64
}

// TimelineEvent is something that happened to the user rather than to one
// message: a block, an unblock, an operator action.
type TimelineEvent struct {
	Time   time.Time `json:"time"`
	Kind   string    `json:"kind"` // automatic_block, block, operator
	What   string    `json:"what"`
	Who    string    `json:"who,omitempty"`
	Reason string    `json:"reason,omitempty"`
	Result string    `json:"result,omitempty"`
	// AuditID links the event to GET /admin/audit.
	AuditID string `json:"audit_id,omitempty"`
}

// Timeline bounds.
const (
	timelineDefaultWindow = 72 * time.Hour // WeChat's own horizon
	timelineMaxWindow     = 14 * 24 * time.Hour
	timelineDefaultMax    = 20000
	timelineMaxRecords    = 200000
	timelineMaxLetters    = 500
	// timelineMaxLetterReads caps the letters read whole (for their
	// message) when their record is outside the window.
	timelineMaxLetterReads = 50
)

func (s *timelines) customerTimeline(w http.ResponseWriter, r *http.Request) {
	user, e := s.pathUser(r)
	if e != nil {
		writeError(w, e)
		return
	}
	q := r.URL.Query()
	msgid := q.Get("msgid")
	if msgid != "" {
		if e := identifier("msgid", msgid, maxIDLen); e != nil {
			writeError(w, e)
			return
		}
	}
	window := timelineDefaultWindow
	if v := q.Get("window"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Minute || d > s.maxWindow() {
			writeError(w, badRequest("window", fmt.Sprintf(`window must be a duration such as "24h" in [1m, %s]`, s.maxWindow())))
			return
		}
		window = d
	}
	maxRecords := timelineDefaultMax
	if v := q.Get("max_records"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > timelineMaxRecords {
			writeError(w, badRequest("max_records", fmt.Sprintf("max_records must be an integer in [1, %d]", timelineMaxRecords)))
			return
		}
		maxRecords = n
	}
	tl, err := s.timeline(r.Context(), user, msgid, window, maxRecords)
	if e := s.storeError(err, "customer.timeline"); e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, tl)
}

// timeline assembles the story. Only the DLQ index failing is an error
// (nothing could be said); every other source that fails is named in
// Sources and the rest still answers.
func (s *timelines) timeline(ctx context.Context, user, msgid string, window time.Duration, max int) (*Timeline, error) {
	now := s.clock.Now().UTC()
	tl := &Timeline{User: user, MsgID: msgid, Time: now, Since: now.Add(-window), Messages: []TimelineMessage{},
		Events: []TimelineEvent{}, Sources: map[string]string{}, Notes: []string{}}

	letters, truncated, err := s.userLetters(ctx, user)
	if err != nil {
		return nil, err
	}
	tl.Sources["dlq"] = "ok"
	if truncated {
		tl.Notes = append(tl.Notes, fmt.Sprintf("only the user's newest %d dead letters were read", timelineMaxLetters))
	}

	var scan *TopicScan
	src, _ := s.cfg.Pipeline.(CustomerSource)
	if src == nil {
		tl.Sources["main_topic"] = "not configured"
	} else if sc, complete, ok := s.readArchive(ctx, tl, src, max); ok {
		scan, tl.Complete = sc, complete
		if sc.Topic != "" {
			tl.Topic = sc
		}
	} else if sc, err := src.UserRecords(ctx, user, tl.Since, max); err != nil {
		s.log.Warn("timeline: main topic not read: " + err.Error())
		tl.Sources["main_topic"] = "unavailable"
	} else {
		scan = &sc
		tl.Topic = scan
		tl.Sources["main_topic"] = "ok"
		if sc.Incomplete != "" {
			tl.Notes = append(tl.Notes, "main topic: "+sc.Incomplete)
		}
		if sc.Truncated {
			tl.Notes = append(tl.Notes, fmt.Sprintf("main topic: only the partition's newest %d records were read (max_records)", max))
		}
		if sc.Expired {
			tl.Notes = append(tl.Notes, "main topic: the window begins before the oldest record the topic still keeps")
		}
		tl.Complete = !sc.Truncated && !sc.Expired && sc.Incomplete == ""
	}

	msgs := s.joinMessages(ctx, scan, letters)
	userMsgs := len(msgs) // the user is known even when msgid is not
	if msgid != "" {
		msgs = slices.DeleteFunc(msgs, func(m *TimelineMessage) bool {
			if m.UpstreamMsgID == msgid {
				return false
			}
			for _, rec := range m.Received {
				if rec.MessageID == msgid {
					return false
				}
			}
			for _, l := range m.Letters {
				if l.ID == msgid {
					return false
				}
			}
			return true
		})
	}

	if src != nil && len(msgs) > 0 {
		refs := make([]MessageRef, len(msgs))
		for i, m := range msgs {
			refs[i] = MessageRef{OpenKfID: m.OpenKfID, UpstreamMsgID: m.UpstreamMsgID}
			if m.SendTime != nil {
				refs[i].SendTime = m.SendTime.Unix()
			}
		}
		if fx, err := src.Effects(ctx, user, refs); err != nil || len(fx) != len(msgs) {
			s.log.Warn(fmt.Sprintf("timeline: dedup and reply marks not read: %v", err))
			tl.Sources["dedup"] = "unavailable"
		} else {
			tl.Sources["dedup"] = "ok"
			for i := range msgs {
				msgs[i].effects = fx[i]
			}
		}
	}
	for _, m := range msgs {
		if m.effects.Done == "" {
			m.effects.Done = DoneUnknown
		}
		tell(m)
		tl.Messages = append(tl.Messages, *m)
	}

	if st, err := s.rl.Status(ctx, user); err != nil {
		s.log.Warn("timeline: limiter not read: " + err.Error())
		tl.Sources["limiter"] = "unavailable"
	} else {
		tl.Sources["limiter"] = "ok"
		tl.Limiter = &st
		for _, t := range st.BlockHistory {
			tl.Events = append(tl.Events, TimelineEvent{Time: t, Kind: "automatic_block",
				What: "the rate limiter blocked the user (progressive penalty)"})
		}
		if st.Blocked {
			what := "blocked now, permanently"
			at := now
			if !st.Permanent && st.BlockedUntil != nil {
				what = "blocked now, until " + st.BlockedUntil.UTC().Format(time.RFC3339)
			}
			tl.Events = append(tl.Events, TimelineEvent{Time: at, Kind: "block", What: what})
		}
	}

	if err := s.userAudit(ctx, tl, letters); err != nil {
		s.log.Warn("timeline: audit stream not read: " + err.Error())
		tl.Sources["audit"] = "unavailable"
	} else {
		tl.Sources["audit"] = "ok"
	}
	slices.SortStableFunc(tl.Events, func(a, b TimelineEvent) int { return b.Time.Compare(a.Time) })

	tl.Known = userMsgs > 0 || len(letters) > 0 || len(tl.Events) > 0 ||
		(tl.Limiter != nil && (tl.Limiter.Blocked || len(tl.Limiter.BlockHistory) > 0))
	tl.Summary = summarize(tl)
	return tl, nil
}

// userLetters reads the user's dead letters, newest first, up to
// timelineMaxLetters.
func (s *timelines) userLetters(ctx context.Context, user string) ([]DLQMessage, bool, error) {
	var out []DLQMessage
	f := DLQFilter{User: user, Limit: 200}
	for {
		page, next, err := s.dlq.List(ctx, f)
		if err != nil {
			return nil, false, err
		}
		out = append(out, page...)
		if len(out) >= timelineMaxLetters {
			return out[:timelineMaxLetters], true, nil
		}
		if next == "" {
			return out, false, nil
		}
		f.Cursor = next
	}
}

type sourceAt struct {
	p int32
	o int64
}

// joinMessages groups the records by message (open_kfid, upstream msgid)
// and puts each letter with the message of the record it failed on; a
// letter whose record lies outside the window is read whole for its
// message.
func (s *timelines) joinMessages(ctx context.Context, scan *TopicScan, letters []DLQMessage) []*TimelineMessage {
	byKey := map[string]*TimelineMessage{}
	var msgs []*TimelineMessage
	get := func(openKfID, upstream string) *TimelineMessage {
		k := openKfID + ":" + upstream
		m := byKey[k]
		if m == nil {
			m = &TimelineMessage{UpstreamMsgID: upstream, OpenKfID: openKfID, Received: []TopicRecord{},
				Replies: []ReplyMark{}, Letters: []DLQMessage{}}
			byKey[k] = m
			msgs = append(msgs, m)
		}
		return m
	}
	at := map[sourceAt]*TimelineMessage{}
	if scan != nil {
		for _, rec := range scan.Records {
			up := rec.UpstreamMsgID
			if up == "" {
				up = fmt.Sprintf("(undecodable record %d/%d)", rec.Partition, rec.Offset)
			}
			m := get(rec.OpenKfID, up)
			m.Received = append(m.Received, rec)
			m.MsgType, m.Preview = cmp.Or(m.MsgType, rec.MsgType), cmp.Or(m.Preview, rec.Preview)
			if rec.SendTime > 0 && m.SendTime == nil {
				t := time.Unix(rec.SendTime, 0).UTC()
				m.SendTime = &t
			}
			at[sourceAt{rec.Partition, rec.Offset}] = m
		}
	}
	reads := 0
	for _, l := range letters {
		m := at[sourceAt{l.SourcePartition, l.SourceOffset}]
		if m == nil {
			openKfID, upstream, send := "", "", int64(0)
			if reads < timelineMaxLetterReads {
				reads++
				if whole, err := s.dlq.Get(ctx, l.ID); err == nil {
					openKfID, upstream, send = letterMessage(whole)
				}
			}
			if upstream == "" {
				upstream = "(letter " + l.ID + ")"
			}
			m = get(cmp.Or(openKfID, l.OpenKfID), upstream)
			if m.SendTime == nil && send > 0 {
				t := time.Unix(send, 0).UTC()
				m.SendTime = &t
			}
			m.Preview = cmp.Or(m.Preview, l.Preview)
		}
		l.Message = nil
		m.Letters = append(m.Letters, l)
	}
	for _, m := range msgs {
		slices.SortFunc(m.Received, func(a, b TopicRecord) int { return cmp.Compare(a.Offset, b.Offset) })
		slices.SortFunc(m.Letters, func(a, b DLQMessage) int { return b.FailureTime.Compare(a.FailureTime) })
		// Ordered by first receipt (ms), else send time (s), else the
		// oldest letter; ties by offset.
		switch {
		case len(m.Received) > 0:
			m.at, m.off = m.Received[0].Time, m.Received[0].Offset
		case m.SendTime != nil:
			m.at = *m.SendTime
		case len(m.Letters) > 0:
			l := m.Letters[len(m.Letters)-1]
			m.at, m.off = l.FailureTime, l.SourceOffset
		}
	}
	slices.SortStableFunc(msgs, func(a, b *TimelineMessage) int {
		return cmp.Or(b.at.Compare(a.at), cmp.Compare(b.off, a.off))
	})
	return msgs
}

// letterMessage reads a whole letter's original message.
func letterMessage(l DLQMessage) (openKfID, upstream string, sendTime int64) {
	var m struct {
		OpenKfID string `json:"open_kfid"`
		Upstream string `json:"upstream_msgid"`
		SendTime int64  `json:"send_time"`
	}
	if len(l.Message) == 0 || json.Unmarshal(l.Message, &m) != nil {
		return "", "", 0
	}
	return m.OpenKfID, m.Upstream, m.SendTime
}

// tell decides a message's limiter verdict, attempts and outcome and
// writes its story.
func tell(m *TimelineMessage) {
	fx := m.effects
	m.Processed = fx.Done
	m.Replies = append(m.Replies[:0], fx.Replies...)
	m.ReplySkipped = fx.ReplySkipped
	refused, past := false, false
	for _, l := range m.Letters {
		switch r := deadletter.Reason(l.Reason); {
		case r == deadletter.RateLimited, r == deadletter.UserBlocked:
			refused = true
		case deadletter.PastLimiter(r):
			// Given only after the limiter admitted it (the table's
			// PastLimiter: a handler's failure, timeout or refusal, a
			// full mailbox). The breaker's circuit_open and an invalid
			// record come before the limiter looks.
			past = true
		}
	}
	switch {
	case refused:
		m.Limiter = "refused"
	case fx.Done == DoneYes, past:
		// Processed, or failed past the limiter for another reason.
		m.Limiter = "admitted"
	default:
		m.Limiter = "unknown"
	}
	m.Attempts = len(m.Received)
	for _, l := range m.Letters {
		// A letter counts its own retries; the records outside the
		// window are not seen.
		m.Attempts = max(m.Attempts, l.RetryCount+1)
	}
	waiting := false
	for _, l := range m.Letters {
		if l.State == "due" || l.State == "review" {
			waiting = true
		}
	}
	switch {
	case fx.Done == DoneYes && len(fx.Replies) == 0 && fx.ReplySkipped != "":
		m.Outcome = OutcomeReplySkipped
	case fx.Done == DoneYes && len(fx.Replies) > 0:
		m.Outcome = OutcomeAnswered
	case fx.Done == DoneYes:
		m.Outcome = OutcomeProcessed
	case waiting:
		m.Outcome = OutcomeInDLQ
	case fx.Done == DoneNo:
		m.Outcome = OutcomeInProgress
	default:
		m.Outcome = OutcomeUnknownMsg
	}

	var b strings.Builder
	if len(m.Received) > 0 {
		r := m.Received[0]
		fmt.Fprintf(&b, "received %s on partition %d offset %d", r.Time.UTC().Format(time.RFC3339), r.Partition, r.Offset)
		if n := len(m.Received) - 1; n > 0 {
			fmt.Fprintf(&b, ", re-delivered %d time(s) from the DLQ", n)
		}
	} else {
		b.WriteString("no record left on the main topic in the window")
	}
	switch m.Limiter {
	case "refused":
		b.WriteString("; refused by the rate limiter")
	case "admitted":
		b.WriteString("; admitted by the rate limiter")
	}
	for _, l := range m.Letters {
		fmt.Fprintf(&b, "; dead letter %s (%s", l.ID, l.Reason)
		if l.Reason == string(deadletter.HandlerRejected) {
			b.WriteString(": the bot refused it for good")
		}
		fmt.Fprintf(&b, ") %s after %d retr(ies)", letterFate(l), l.RetryCount)
	}
	switch m.Outcome {
	case OutcomeAnswered:
		fmt.Fprintf(&b, "; processed, %d reply(ies) sent", len(fx.Replies))
	case OutcomeProcessed:
		if fx.RepliesUnknown {
			b.WriteString("; processed, replies no longer known (their marks expire)")
		} else {
			b.WriteString("; processed, no reply recorded (the handler sent none)")
		}
	case OutcomeReplySkipped:
		b.WriteString("; processed, the reply skipped: " + skipText(fx.ReplySkipped))
	case OutcomeInDLQ:
		b.WriteString("; not processed yet: waiting in the DLQ")
	case OutcomeInProgress:
		b.WriteString("; not processed yet")
	case OutcomeUnknownMsg:
		b.WriteString("; whether it was processed is no longer known (the dedup marks expire)")
	}
	m.Story = b.String()
}

// skipText says why a reply was skipped, from its reason.
func skipText(reason string) string {
	switch reason {
	case "servicer_session":
		return "a human servicer held the session (WeChat 95018)"
	case "reply_window":
		return "WeChat's reply window was used up (5 replies or 48 hours: 95001/95002)"
	case "session_ended":
		return "the session had ended (95013)"
	case "welcome_code_expired":
		return "the welcome or event code had expired or was used (95017)"
	}
	return reason
}

func letterFate(l DLQMessage) string {
	switch l.State {
	case "due":
		if l.NextRetryTime != nil {
			return "due for a retry at " + l.NextRetryTime.UTC().Format(time.RFC3339)
		}
		return "due for a retry"
	case "review":
		return "waiting for manual review"
	case "retried":
		return "re-injected into the main topic"
	}
	return l.State
}

// userAudit adds the operator actions on the user or their letters,
// scanning at most auditScan entries of the audit stream, newest first.
func (s *timelines) userAudit(ctx context.Context, tl *Timeline, letters []DLQMessage) error {
	ids := make(map[string]bool, len(letters))
	for _, l := range letters {
		ids["dlq:"+l.ID] = true
	}
	userTarget, filterUser := "user:"+tl.User, "user="+tl.User
	next, err := s.scanAudit(ctx, "+", auditScan, 500, func(e AuditEntry) bool {
		onUser := e.Target == userTarget || strings.HasPrefix(e.Target, userTarget+" ") || ids[e.Target] ||
			hasField(e.Target, filterUser)
		// A dry run is counted, not done: not an action on the customer.
		if onUser && !isDryRun(e.Result) {
			t, _ := time.Parse(time.RFC3339Nano, e.Time)
			tl.Events = append(tl.Events, TimelineEvent{Time: t, Kind: "operator", What: e.Action + " " + e.Target,
				Who: e.Who, Reason: e.Reason, Result: e.Result, AuditID: e.ID})
		}
		return true
	})
	if err == nil && next != "" {
		tl.Notes = append(tl.Notes, fmt.Sprintf("only the newest %d audit entries were searched", auditScan))
	}
	return err
}

func hasField(target, field string) bool {
	return slices.Contains(strings.Fields(target), field)
}

// summarize writes the timeline's first line. It names the range of
// time actually read, and says "nothing known" only when the whole window
// was read.
func summarize(tl *Timeline) string {
	where := "the DLQ index, the rate limiter and the audit stream"
	tl.Read = readRange(tl)
	if tl.Read != "" {
		where = tl.Read + ", " + where
	}
	subject := "user " + tl.User
	if tl.MsgID != "" {
		subject = "message " + tl.MsgID + " of user " + tl.User
	}
	if len(tl.Messages) == 0 {
		if tl.MsgID != "" && tl.Known {
			return fmt.Sprintf("message %s of user %s is not kept in %s; only the user's events are shown", tl.MsgID, tl.User, where)
		}
		if tl.Known {
			return fmt.Sprintf("no message of %s is kept in %s; only the events below are known", subject, where)
		}
		if !tl.Complete {
			return fmt.Sprintf("nothing found about %s in what was read: %s. The window since %s was not read whole (see the notes): older messages may exist",
				subject, where, tl.Since.Format(time.RFC3339))
		}
		return fmt.Sprintf("nothing known about %s: no trace in %s. The id may be wrong, or everything about it has expired", subject, where)
	}
	counts := map[string]int{}
	for _, m := range tl.Messages {
		counts[m.Outcome]++
	}
	var parts []string
	for _, o := range []string{OutcomeAnswered, OutcomeProcessed, OutcomeReplySkipped, OutcomeInDLQ, OutcomeInProgress, OutcomeUnknownMsg} {
		if counts[o] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[o], strings.ReplaceAll(o, "_", " ")))
		}
	}
	s := fmt.Sprintf("%d message(s) of %s found: %s; the newest is %s", len(tl.Messages), subject,
		strings.Join(parts, ", "), strings.ReplaceAll(tl.Messages[0].Outcome, "_", " "))
	if l := tl.Limiter; l != nil && l.Blocked {
		s += "; the user is blocked by the rate limiter now"
	}
	switch {
	case tl.Read == "":
	case tl.Complete:
		// No timestamps: the headline stays the same from one read to
		// the next.
		from := "the main topic"
		if tl.Archive != nil {
			from = "the archive"
		}
		s += fmt.Sprintf("; the whole %s window read from %s", tl.Time.Sub(tl.Since).Round(time.Second), from)
	default:
		s += "; read: " + tl.Read + ", not the whole window since " + tl.Since.Format(time.RFC3339) + " (see the notes)"
	}
	return s
}
