-- The reminder family's liveness rule: every stored reminder (armed, or firing until its turn
-- is created) counts.
family('reminder', {
  key = K.live_reminders,
  ids = function(sid) return sorted_members(K.live_reminders(sid)) end,
  verdict = function() return 'live' end, hash = K.reminder, fields = {'prompt', 'dueAt'},
})
