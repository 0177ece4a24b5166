package kfpipe

import (
	"context"
	"strings"
	"sync"
)

// Router is a Handler that sends each message to the handler registered
// for it, so a bot is a list of routes instead of one switch:
//
//   - events (MsgEvent) by their type (Event), e.g. EventEnterSession;
//   - the customer's messages, in this order: a tap on a menu item by the
//     item's id (Menu), a text by its keyword (Keyword: the whole text,
//     trimmed, case ignored), any message by its type (Type, e.g.
//     MsgImage), then the default (Default);
//   - a servicer's own messages (FromServicer) to Servicer only.
//
// A message no route takes is finished (nil): in particular a servicer's
// message is never answered by a customer's route. Middleware added with
// Use wraps every route, the default and Servicer (Chain's order), and
// runs for the messages no route takes too.
//
// Register the routes before the Router handles messages; it is then safe
// for concurrent use. Routing reads the message's typed content once
// (Message.Text, MenuID, Event).
type Router struct {
	mu       sync.RWMutex
	mw       []Middleware
	events   map[string]Handler
	menus    map[string]Handler
	keywords map[string]Handler
	types    map[string]Handler
	servicer Handler
	def      Handler
	built    Handler // the routes wrapped in mw, made on first use
}

// NewRouter returns a Router with no routes: every message is finished
// unanswered until routes are added.
func NewRouter() *Router {
	return &Router{events: map[string]Handler{}, menus: map[string]Handler{}, keywords: map[string]Handler{},
		types: map[string]Handler{}}
}

// Use adds middleware around every route (the first added is the
// outermost).
func (r *Router) Use(mw ...Middleware) *Router {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mw = append(r.mw, mw...)
	r.built = nil
	return r
}

// Event routes events of eventType (EventEnterSession,
// EventSessionStatusChange, …) to h.
func (r *Router) Event(eventType string, h Handler) *Router {
	return r.add(r.events, eventType, h)
}

// Menu routes the customer's tap on the menu item id (Message.MenuID) to
// h; it comes before Keyword, whatever the item's text.
func (r *Router) Menu(id string, h Handler) *Router { return r.add(r.menus, id, h) }

// Keyword routes a customer's text whose whole content is one of words
// (trimmed, case ignored) to h.
func (r *Router) Keyword(h Handler, words ...string) *Router {
	for _, w := range words {
		r.add(r.keywords, normKeyword(w), h)
	}
	return r
}

// Type routes the customer's messages of msgType (MsgText, MsgImage,
// MsgVoice, MsgVideo, MsgFile, MsgLocation, …) that no Menu or Keyword
// route took to h.
func (r *Router) Type(msgType string, h Handler) *Router { return r.add(r.types, msgType, h) }

// Servicer routes a servicer's own messages (Message.FromServicer) to h;
// without it they are finished unanswered.
func (r *Router) Servicer(h Handler) *Router {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.servicer, r.built = h, nil
	return r
}

// Default routes the customer's messages no other route took to h;
// without it they are finished unanswered.
func (r *Router) Default(h Handler) *Router {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.def, r.built = h, nil
	return r
}

func (r *Router) add(m map[string]Handler, key string, h Handler) *Router {
	if h == nil {
		panic("kfpipe: Router: a route needs a handler (" + key + ")")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	m[key], r.built = h, nil
	return r
}

func normKeyword(s string) string { return strings.ToLower(strings.TrimSpace(s)) }

// Route returns the handler m goes to (nil when no route takes it),
// without middleware.
func (r *Router) Route(m *Message) Handler {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.route(m)
}

func (r *Router) route(m *Message) Handler {
	if ev, ok := m.Event(); ok {
		return r.events[ev.Type]
	}
	if m.IsEvent() {
		return nil // an event without a readable event object
	}
	if m.FromServicer() {
		return r.servicer
	}
	if !m.FromCustomer() {
		return nil
	}
	if id := m.MenuID(); id != "" {
		if h := r.menus[id]; h != nil {
			return h
		}
	}
	if text, ok := m.Text(); ok {
		if h := r.keywords[normKeyword(text)]; h != nil {
			return h
		}
	}
	if h := r.types[m.MsgType]; h != nil {
		return h
	}
	return r.def
}

// Handle implements Handler: m goes to its route, through the middleware.
func (r *Router) Handle(ctx context.Context, m *Message) error {
	r.mu.RLock()
	h := r.built
	r.mu.RUnlock()
	if h == nil {
		r.mu.Lock()
		if r.built == nil {
			r.built = Chain(HandlerFunc(r.dispatch), r.mw...)
		}
		h = r.built
		r.mu.Unlock()
	}
	return h.Handle(ctx, m)
}

// dispatch runs m's route (nil when none takes it).
func (r *Router) dispatch(ctx context.Context, m *Message) error {
	h := r.Route(m)
	if h == nil {
		return nil
	}
	return h.Handle(ctx, m)
}
