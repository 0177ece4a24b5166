package admin

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// auditEntry is one write as the audit stream records it (I8: who, what,
// why, when, and how it ended).
type auditEntry struct {
	Who    string
	Action string
	Target string
	Reason string
	Result string
}

// audit appends e to <prefix>audit and logs it. The write already happened,
// so a failing XADD does not turn the answer into an error (the operator
// would retry a done write); the log line carries the same fields and a
// metric counts the miss.
func (s *base) audit(ctx context.Context, e auditEntry) {
	now := s.clock.Now().UTC().Format(time.RFC3339Nano)
	fields := []zap.Field{zap.String("who", e.Who), zap.String("action", e.Action), zap.String("target", e.Target),
		zap.String("reason", e.Reason), zap.String("time", now), zap.String("result", e.Result)}
	// A client that hangs up must not cancel its own audit entry.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	err := s.rdb.XAdd(ctx, &redis.XAddArgs{
		Stream: s.cfg.Prefix + "audit",
		MaxLen: s.cfg.AuditMaxLen,
		Approx: true,
		Values: []string{"who", e.Who, "action", e.Action, "target", e.Target, "reason", e.Reason,
			"time", now, "result", e.Result},
	}).Err()
	if err != nil {
		s.m.auditFailures.Inc()
		s.log.Error("admin audit not written to redis", append(fields, zap.Error(err))...)
		return
	}
	s.log.Info("admin audit", fields...)
}
