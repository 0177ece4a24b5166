// Package obs owns the process's observability: the zap logger, the
// Prometheus registry and the ops HTTP server (/metrics, /healthz, /readyz,
// pprof).
package obs

import (
	"fmt"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kfpipe/kfpipe/internal/config"
)

// Log field names shared by every package, so logs can be joined across
// daemons.
const (
	FieldUserID    = "user_id"
	FieldOpenKfID  = "open_kfid"
	FieldMsgID     = "msg_id"
	FieldPartition = "partition"
	FieldOffset    = "offset"
)

// NewLogger builds the zap logger: JSON in production, console otherwise,
// level from config.
func NewLogger(c config.Log, daemon string) (*zap.Logger, error) {
	var zc zap.Config
	if c.Format == "json" {
		zc = zap.NewProductionConfig()
	} else {
		zc = zap.NewDevelopmentConfig()
		zc.EncoderConfig.EncodeLevel = zapcore.CapitalLevelEncoder
	}
	lvl, err := zapcore.ParseLevel(c.Level)
	if err != nil {
		return nil, fmt.Errorf("log.level: %w", err)
	}
	zc.Level = zap.NewAtomicLevelAt(lvl)
	zc.DisableStacktrace = lvl > zapcore.DebugLevel
	l, err := zc.Build()
	if err != nil {
		return nil, fmt.Errorf("build logger: %w", err)
	}
	return l.With(zap.String("daemon", daemon)), nil
}
